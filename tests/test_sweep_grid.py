"""Sweep grids, templates, the --where evaluator and points: pure, no SSH."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multihost.errors import UsageError
from multihost.sweep.grid import (
    GridFile,
    Point,
    check_template,
    expand,
    load_grid_file,
    merge_grids,
    parse_grid_arg,
    parse_grid_args,
    parse_value,
    placeholders,
)
from multihost.sweep.where import MAX_WHERE_CHARS, Where

GRID = {"fsdp": ("1", "2", "4", "8"), "tp": ("1", "2", "4", "8"), "b": ("4096", "16384")}
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def where(text: str, names: tuple[str, ...] = ("fsdp", "tp", "b")) -> Where:
    return Where.compile(text, names)


def test_parse_grid_arg_keeps_text() -> None:
    assert parse_grid_arg("fsdp=1,2,4,8") == ("fsdp", ("1", "2", "4", "8"))
    assert parse_grid_arg(" lr = 1e-3, 0.01 ,x") == ("lr", ("1e-3", "0.01", "x"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("fsdp", "NAME=V1"),
        ("=1,2", "not a valid grid name"),
        ("2x=1", "not a valid grid name"),
        ("a-b=1", "not a valid grid name"),
        ("if=1", "not a valid grid name"),
        ("status=1", "reserved"),
        ("fsdp=", "non-empty"),
        ("fsdp=1,,2", "non-empty"),
        ("fsdp=1,2,1", "repeats 1"),
    ],
)
def test_parse_grid_arg_rejects(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_grid_arg(text)


def test_grid_args_keep_order_and_refuse_duplicates() -> None:
    assert list(parse_grid_args(["tp=1,2", "fsdp=4"])) == ["tp", "fsdp"]
    with pytest.raises(UsageError, match="'tp' given twice"):
        parse_grid_args(["tp=1,2", "tp=4"])
    with pytest.raises(UsageError, match="given twice"):
        merge_grids({"tp": ("1",)}, {"tp": ("2",)})


def test_parse_value() -> None:
    assert parse_value("4096") == 4096
    assert parse_value("-3") == -3
    assert parse_value("1e-3") == 0.001
    assert parse_value(".5") == 0.5
    for text in ("nan", "inf", "1_000", "bf16", "4k", "9" * 5000):
        assert parse_value(text) == text


def test_grid_file(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(
        'where = "fsdp * tp == 8"\ncmd = "run {fsdp} {b}"\nmetric = "tflops"\n'
        '[grid]\nfsdp = [1, 2, 4]\nb = ["4096", 16384]\nlr = [0.5]\nname = "x"\n'
    )
    gf = load_grid_file(path)
    assert gf == GridFile(
        {"fsdp": ("1", "2", "4"), "b": ("4096", "16384"), "lr": ("0.5",), "name": ("x",)},
        where="fsdp * tp == 8",
        cmd="run {fsdp} {b}",
        metric="tflops",
    )
    assert list(gf.grid) == ["fsdp", "b", "lr", "name"]
    assert load_grid_file(_write(tmp_path, "[grid]\na = [1]\n")).where is None


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "g.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[grid\n", "not valid TOML"),
        ("where = 1\n[grid]\na = [1]\n", "where must be a string"),
        ("wher = 'a'\n[grid]\na = [1]\n", "unknown key"),
        ("x = 1\n", "unknown key"),
        ("cmd = 'x'\n", r"needs a non-empty \[grid\]"),
        ("[grid]\na = [true]\n", "numbers or strings"),
        ("[grid]\na = [[1]]\n", "numbers or strings"),
        ("[grid]\na = []\n", "non-empty"),
        ("[grid]\na = [1, 1]\n", "repeats"),
        ("[grid]\n'a b' = [1]\n", "not a valid grid name"),
    ],
)
def test_grid_file_rejects(tmp_path: Path, text: str, why: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UsageError, match=why) as info:
        load_grid_file(path)
    assert str(path) in str(info.value)


def test_grid_file_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read grid file"):
        load_grid_file(tmp_path / "nope.toml")


def test_placeholders() -> None:
    assert placeholders("python x.py --a {fsdp} -b {b} --tp={tp}") == {"fsdp", "tp", "b"}
    assert placeholders("echo {{literal}} {b} {b}") == {"b"}
    assert placeholders("no fields") == set()


@pytest.mark.parametrize(
    ("cmd", "why"),
    [
        ("run {}", "positional"),
        ("run {0}", "positional"),
        ("run {x!r}", "conversion or :format"),
        ("run {x:>3}", "conversion or :format"),
        ("run {x.real}", "not a {grid_name} field"),
        ("run {x[0]}", "not a {grid_name} field"),
        ("awk '{print $1}'", "write {{ and }}"),
        ("run {x", "literal braces"),
        ("run x}", "literal braces"),
    ],
)
def test_placeholders_reject(cmd: str, why: str) -> None:
    with pytest.raises(UsageError, match=re.escape(why)):
        placeholders(cmd)


def test_check_template() -> None:
    check_template("run {fsdp} {tp} {b}", GRID)
    with pytest.raises(UsageError, match=r"uses \{bs\}, \{dp\} with no --grid"):
        check_template("run {fsdp} {tp} {b} {dp} {bs}", GRID)
    with pytest.raises(UsageError, match="--grid tp, b not used by --cmd"):
        check_template("run {fsdp}", GRID)
    with pytest.raises(UsageError, match=r"\{x\} with no --grid; --grid b not used"):
        check_template("run {fsdp} {tp} {x}", GRID)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fsdp * tp == 4", True),
        ("fsdp + tp * 2 == 6", True),  # precedence: 2 + 2*2
        ("(fsdp + tp) * 2 == 8", True),
        ("b // fsdp - 2048 == 0", True),
        ("b / 3 > 1365", True),
        ("b % 1000 == 96", True),
        ("2 ** tp == 4 and -fsdp == -2 and +tp == 2", True),
        ("1 < fsdp <= tp < 3", True),
        ("1 < fsdp < 2", False),
        ("fsdp == 1 or tp == 2", True),
        ("not fsdp == 2", False),
        ("not (fsdp == 1 or tp == 1)", True),
        ("fsdp != 2 or tp != 2", False),
        ("fsdp >= 2 >= tp", True),
        ("fsdp", True),
        ("fsdp - tp", False),
        ("(fsdp == 2) + (tp == 2) == 2", True),
        ("True and fsdp == 2.0", True),
        ("dtype == 'bf16'", True),
        ("dtype != 'bf16' or dtype < 'c'", True),
    ],
)
def test_where_evaluates(text: str, expected: bool) -> None:
    values = {"fsdp": 2, "tp": 2, "b": 4096, "dtype": "bf16"}
    assert where(text, tuple(values)).matches(values) is expected


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("__import__('os')", "function calls"),
        ("len(fsdp)", "function calls"),
        ("fsdp.real", "attribute access"),
        ("fsdp.__class__", "attribute access"),
        ("'ab'[0] == 'a'", "subscripts"),
        ("(lambda: 1)()", "function calls"),
        ("lambda: 1", "lambda"),
        ("[x for x in (1, 2)]", "comprehensions"),
        ("any(x for x in ())", "function calls"),
        ("(fsdp := 3)", ":="),
        ("f'{fsdp}' == '2'", "f-strings"),
        ("1 if fsdp else 2", "if/else"),
        ("fsdp & 1", "&"),
        ("~fsdp", "~"),
        ("fsdp in (1, 2)", "in"),
        ("fsdp is None", "is"),
        ("[fsdp]", "list"),
        ("fsdp == None", "the constant None"),
        ("fsdp == 1j", "the constant 1j"),
        ("fsdp == b'x'", "the constant b'x'"),
    ],
)
def test_where_rejects(text: str, what: str) -> None:
    with pytest.raises(UsageError, match=f"^not allowed in --where: {re.escape(what)}$"):
        where(text)


def test_where_unknown_name_lists_known() -> None:
    with pytest.raises(UsageError, match=r"unknown name 'dp' \(grid names: fsdp, tp, b\)"):
        where("dp * tp == 8")
    with pytest.raises(UsageError, match="unknown name 'os'"):
        where("os == 1")


def test_where_limits() -> None:
    with pytest.raises(UsageError, match="exponent 100 is larger than 64"):
        where("fsdp ** 100 > 1")
    with pytest.raises(UsageError, match="longer than"):
        where("fsdp" + " + fsdp" * MAX_WHERE_CHARS)
    with pytest.raises(UsageError, match="nested too deeply"):
        where("-" * 500 + "fsdp")
    with pytest.raises(UsageError, match="invalid syntax"):
        where("fsdp ==")
    with pytest.raises(UsageError, match="invalid syntax"):
        where("import os")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2 ** b > 1", "exponent 4096 is larger than 64"),
        ("(b ** 64) ** 64 > 1", "result too large"),
        ("b * b * b * b * b * b * b * b > 0", ""),  # fine: 96 bits
        ("fsdp / (tp - tp) > 1", "division by zero"),
        ("fsdp % (tp - 1) == 0", "modulo by zero"),
        ("(-fsdp) ** 0.5 > 0", "complex result"),
        ("2.0 ** 60 * 1e300 ** 3 > 1", "Numerical result out of range"),
        ("dtype + 1 == 2", "+ needs numbers, got 'bf16'"),
        ("dtype * 3 == 'x'", "* needs numbers"),
        ("-dtype == 1", "- needs numbers"),
        ("dtype < 3", "not supported"),
    ],
)
def test_where_errors_name_the_point(text: str, why: str) -> None:
    names = ("fsdp", "tp", "b", "dtype")
    values = {"fsdp": 1, "tp": 1, "b": 4096, "dtype": "bf16"}
    w = where(text, names)
    if not why:
        assert w.matches(values)
        return
    with pytest.raises(UsageError, match=re.escape(why)) as info:
        w.matches(values)
    assert "fsdp=1 tp=1 b=4096 dtype=bf16" in str(info.value)


def test_where_never_runs_code(capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("print('x')", "__import__('os').system('echo pwned')", "open('/etc/passwd')"):
        with pytest.raises(UsageError):
            where(text)
    assert capsys.readouterr().out == ""


def test_expand_order_and_filter() -> None:
    points = expand(GRID, where("fsdp * tp == 8"))
    assert [p.label for p in points] == [
        "fsdp=1 tp=8 b=4096",
        "fsdp=1 tp=8 b=16384",
        "fsdp=2 tp=4 b=4096",
        "fsdp=2 tp=4 b=16384",
        "fsdp=4 tp=2 b=4096",
        "fsdp=4 tp=2 b=16384",
        "fsdp=8 tp=1 b=4096",
        "fsdp=8 tp=1 b=16384",
    ]
    assert [p.index for p in points] == list(range(8))
    assert points[2].as_dict() == {"fsdp": 2, "tp": 4, "b": 4096}
    assert points[2].values == (("fsdp", "2"), ("tp", "4"), ("b", "4096"))
    assert len(expand(GRID)) == 32


def test_expand_errors() -> None:
    with pytest.raises(UsageError, match="leaves no points of 32"):
        expand(GRID, where("fsdp * tp == 1000"))
    with pytest.raises(UsageError, match="at least one --grid"):
        expand({})
    huge = {f"a{i}": tuple(str(v) for v in range(10)) for i in range(6)}
    with pytest.raises(UsageError, match="1000000 points"):
        expand(huge)
    with pytest.raises(UsageError, match="division by zero"):
        expand({"a": ("0", "1")}, Where.compile("1 / a > 0", ["a"]))


def test_command_substitutes_verbatim() -> None:
    p = Point(0, (("fsdp", "4"), ("lr", "1e-3"), ("opt", "'adam w'")))
    cmd = "python s.py --fsdp {fsdp} --lr={lr} --opt {opt} --json '{{\"a\": {fsdp}}}'"
    assert p.command(cmd) == "python s.py --fsdp 4 --lr=1e-3 --opt 'adam w' --json '{\"a\": 4}'"
    assert p.as_dict() == {"fsdp": 4, "lr": 0.001, "opt": "'adam w'"}
    with pytest.raises(UsageError, match=r"uses \{tp\} with no --grid"):
        p.command("run {fsdp} {tp}")


def test_point_ids_safe_stable_and_unique() -> None:
    assert Point(3, (("fsdp", "4"), ("tp", "2"), ("b", "4096"))).id == "fsdp4-tp2-b4096"
    # The id comes from the values alone: a different place in the sweep keeps it.
    assert Point(0, (("fsdp", "4"),)).id == Point(9, (("fsdp", "4"),)).id
    awkward = ["a/b", "a_b", "a b", "a-b", "-1", "1", "_1", "x;rm -rf ~", "é", "../..", "1e-3"]
    grid = {"_v": tuple(awkward), "w": ("1", "a" * 200)}
    ids = [p.id for p in expand(grid)]
    assert len(set(ids)) == len(ids)
    for pid in ids:
        assert SAFE_ID.match(pid), pid
        assert len(pid) <= 90
    assert expand({"v": ("a/b",)})[0].id.startswith("va_b-h")
