"""scripts/bench_auto.py: the command its report records runs as is."""

from tests import load_script


def test_command_line_parses_back_to_the_same_arguments(monkeypatch):
  mod = load_script("bench_auto", "bench_auto_under_test")
  parser_args = {}

  def parse(argv):
    monkeypatch.setattr("sys.argv", ["bench_auto.py"] + argv)
    ap = mod.build_parser()
    parser_args["ns"] = ap.parse_args()
    return parser_args["ns"]

  for argv in (["--pairs=random-gemma"], ["--no_hierarchy", "--repeats=2"]):
    args = parse(argv)
    line = mod.command_line(args)
    assert line.startswith("python scripts/bench_auto.py ")
    again = parse(line.split()[2:])
    assert vars(again) == vars(args)
  assert "--no_hierarchy" not in mod.command_line(parse([]))
