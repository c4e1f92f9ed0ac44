"""scripts/bench_auto.py: the command its report records runs as is."""

from tests import load_script


def test_command_line_parses_back_to_the_same_arguments():
  mod = load_script("bench_auto", "bench_auto_under_test")
  parse = lambda argv: mod.build_parser().parse_args(argv)
  for argv in (["--pairs=random-gemma"], ["--no_hierarchy", "--repeats=2"]):
    args = parse(argv)
    line = mod.command_line(args)
    assert line.startswith("python scripts/bench_auto.py ")
    assert vars(parse(line.split()[2:])) == vars(args)
  assert "--no_hierarchy" not in mod.command_line(parse([]))
