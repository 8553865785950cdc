"""A TPU host's figures for ``multihost top``: ``python3 -c SOURCE EVERY COUNT``.

Every EVERY seconds (COUNT times; 0: until stdout is gone) one ``tpu DEVICE USED TOTAL BUSY``
line per TPU device from libtpu's runtime metrics through ``tpu-info``'s library (HBM bytes
used and in all, the duty cycle in percent), read from the metrics server that libtpu starts
in the running workload. Says ``tpu none WHY`` instead when there is no ``tpu_info`` or no
chip, ``tpu nometrics WHY`` while the server does not answer (no workload yet, or a libtpu
that serves no metrics without ``TPU_RUNTIME_METRICS_PORTS=8431``). Only the standard
library besides tpu-info; never a traceback.
"""

import contextlib
import sys
import time


def main(every: float, count: int) -> None:
    try:
        from tpu_info import device, metrics  # type: ignore[import-not-found]
    except Exception as e:
        print(f"tpu none no tpu-info ({type(e).__name__})", flush=True)
        return
    try:
        chip, _ = device.get_local_chips()
    except Exception as e:
        print(f"tpu none {type(e).__name__}", flush=True)
        return
    if chip is None:
        print("tpu none no TPU chip", flush=True)
        return
    done = 0
    while True:
        try:
            for u in metrics.get_chip_usage(chip):
                used, total, busy = u.memory_usage, u.total_memory, u.duty_cycle_pct
                print(f"tpu {u.device_id} {used} {total} {busy:.1f}", flush=True)
        except Exception as e:
            print(f"tpu nometrics {type(e).__name__}", flush=True)
        done += 1
        if count and done >= count:
            return
        time.sleep(every)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        main(float(sys.argv[1]), int(sys.argv[2]))
