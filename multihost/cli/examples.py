"""The examples at the end of each command's ``--help`` (as gcloud and uv end theirs)."""

from __future__ import annotations


def _block(*lines: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


EXAMPLES: dict[str, str] = {
    "run": _block(
        'multihost run --local 4 --cmd "python payloads/shardings.py -d 512 -b 128"',
        "multihost run --hosts 'h[0-3]' --cmd \"python train.py\"",
        'multihost run --prefix myqr --wait --cmd "python train.py" --pull out/',
        'multihost run --hosts fleet.toml --detach --cmd "python train.py"',
        'multihost run --prefix myqr --workers 0,2 --cmd "df -h /tmp"  # no JAX',
        "multihost run --local 2 --payload shardings -- -d 512 -b 128",
    ),
    "config": _block(
        "multihost config",
        "multihost config --profile v5e --json",
    ),
    "hosts": _block(
        "multihost hosts --hosts 'h[0-7]'",
        "multihost hosts --prefix myqr --check",
        "multihost hosts --prefix myqr --workers s1 --check   # slice 1 only",
    ),
    "envs": _block(
        "multihost envs --hosts fleet.toml",
        "multihost envs --prefix myqr --workers 0 --json",
    ),
    "kill-stale": _block(
        "multihost kill-stale --prefix myqr",
        "multihost kill-stale --prefix myqr --workers s0/w[0-3]",
    ),
    "forget": _block(
        "multihost forget --prefix myqr   # after re-creating its VMs",
        "multihost forget --hosts 'h[0-3]' --exclude-workers 0",
    ),
    "attach": _block(
        "multihost attach RUN",
        "multihost attach RUN --stream all --stop-on-interrupt",
    ),
    "status": _block(
        "multihost status RUN",
        "multihost status RUN --refresh --workers s1 --json",
    ),
    "logs": _block(
        "multihost logs RUN                      # host s0/w0",
        "multihost logs RUN --host s1/w3 --tail 50",
        "multihost logs RUN --all --grep 'loss' --workers s0",
        "multihost logs RUN --gather",
        "multihost logs RUN --follow",
    ),
    "pull": _block(
        "multihost pull RUN out/metrics.json",
        "multihost pull RUN 'ckpt/*' --to ./ckpts --workers 0",
        "multihost pull RUN /tmp/core.* --exclude-workers s0/w0",
    ),
    "top": _block(
        "multihost top                    # the latest run, full screen; q quits",
        "multihost top RUN --workers s1   # slice 1 only",
        "multihost top RUN --once --json  # one snapshot for a script",
    ),
    "plot": _block(
        "multihost plot RUN",
        "multihost plot RUN --out steps.png",
    ),
    "stack": _block(
        "multihost stack RUN",
        "multihost stack RUN --all --native --workers s0/w[0-3]",
    ),
    "trace": _block(
        "multihost trace RUN",
        "multihost trace RUN --seconds 5 --name step-100",
    ),
    "kill": _block(
        "multihost kill RUN",
        "multihost kill RUN --signal INT --grace 30",
        "multihost kill RUN --workers s0/w3   # the others go on",
    ),
    "sweep": _block(
        "multihost sweep --local 4 --grid d=256,512 --grid b=64,128 \\",
        '    --cmd "python payloads/shardings.py -d {d} -b {b}"',
        "multihost sweep --prefix myqr --grid-file grid.toml --parallel slice",
        "multihost sweep --hosts fleet.toml --grid-file grid.toml --run-name s1 \\",
        "    --resume",
    ),
    "ls": _block("multihost ls", "multihost ls --json"),
    "clean": _block(
        "multihost clean --older-than 7d --dry-run",
        "multihost clean --older-than 12h",
        "multihost clean --compile-caches --dry-run",
    ),
    "job": _block(
        "multihost job submit train --tpu-type v5litepod-16 \\",
        "    --runtime-version v2-alpha-tpuv5-lite --zone us-west4-a \\",
        '    --bucket gs://my-bucket --spot --cmd "python train.py" --watch',
        "multihost job status train",
        "multihost job logs train --host 0/1 --follow",
    ),
    "job submit": _block(
        "multihost job submit train --tpu-type v4-16 \\",
        "    --runtime-version tpu-ubuntu2204-base --zone us-central2-b \\",
        '    --bucket gs://my-bucket --cmd "python train.py"',
        "multihost job submit big --tpu-type v5p-64 --num-slices 2 \\",
        "    --runtime-version V --bucket gs://my-bucket --spot --max-restarts 3 \\",
        '    --secret HF_TOKEN=hf-token --cmd "python train.py" --watch',
    ),
    "job watch": _block("multihost job watch train", "multihost job watch train --keep --detach"),
    "job status": _block("multihost job status train", "multihost job status train --json"),
    "job logs": _block(
        "multihost job logs train",
        "multihost job logs train --host 1/0 --attempt 0",
        "multihost job logs train --all --follow",
    ),
    "job stop": _block("multihost job stop train"),
    "job ls": _block("multihost job ls", "multihost job ls --json"),
    "up": _block(
        "multihost up exp1 --tpu-type v4-16 --runtime-version tpu-ubuntu2204-base \\",
        "    --zone us-central2-b",
        "multihost up exp2 --tpu-type v5litepod-16 --num-slices 2 --spot \\",
        "    --runtime-version v2-alpha-tpuv5-lite --zones us-west4-a,us-east5-b \\",
        "    --autodown 30m",
    ),
    "down": _block(
        "multihost down exp1",
        "multihost down exp1 --async",
        "multihost down exp1 --zone us-central2-b   # made elsewhere: by its label",
    ),
    "pods": _block(
        "multihost pods", "multihost pods --json", "multihost pods --zones us-central2-b,us-east1-d"
    ),
    "gc": _block(
        "multihost gc --dry-run",
        "multihost gc",
        "multihost gc --dry-run --zones us-central2-b,us-east1-d",
    ),
    "autodown": _block("multihost autodown exp1 30m", "multihost autodown exp1 off"),
    "sandbox": _block(
        "multihost sandbox up --hosts 4",
        'multihost sandbox env   # in a shell: eval "$(multihost sandbox env)"',
        "multihost sandbox down",
    ),
    "sandbox up": _block("multihost sandbox up", "multihost sandbox up --hosts 2"),
    "sandbox env": _block('multihost sandbox env   # in a shell: eval "$(multihost sandbox env)"'),
    "sandbox down": _block("multihost sandbox down"),
}
