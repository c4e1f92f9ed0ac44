"""Every shipped gin file and ml_collections config parses and builds."""

import glob
import os

import gin
import pytest

from configs import models as model_configs
from configs import sweeps
from specdec_jax import decoding, main, models, runs

GIN = main.GIN_DIR
REQUIRED = [  # values for the REQUIRED macros of the real-model files
    "GEMMA_TOKENIZER = '/path/tokenizer.model'",
    "GEMMA_2B_CHECKPOINT = '/ckpt/g1_2b'",
    "GEMMA_7B_CHECKPOINT = '/ckpt/g1_7b'",
    "GEMMA2_2B_CHECKPOINT = '/ckpt/g2_2b'",
    "GEMMA2_9B_CHECKPOINT = '/ckpt/g2_9b'",
    "GEMMA2_27B_CHECKPOINT = '/ckpt/g2_27b'",
    "GEMMA3_TOKENIZER = '/path/gemma3.model'",
    "GEMMA3_270M_CHECKPOINT = '/ckpt/g3_270m.gguf'",
    "GEMMA3_1B_CHECKPOINT = '/ckpt/g3_1b'",
    "GEMMA3_4B_CHECKPOINT = '/ckpt/g3_4b'",
    "GEMMA3_12B_CHECKPOINT = '/ckpt/g3_12b'",
    "GEMMA3_27B_CHECKPOINT = '/ckpt/g3_27b'",
]


def _files(sub):
  return sorted(os.path.relpath(p, GIN)
                for p in glob.glob(os.path.join(GIN, sub, "*.gin")))


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _build(files, bindings=(), monkeypatch=None):
  """Parses files, then runs `run` with decode mocked; returns its args."""
  main.parse_gin(files, list(bindings))
  seen = {}

  def fake_decode(drafter, verifier, method, sampling, *args, **kwargs):
    seen.update(drafter=drafter, verifier=verifier, method=method,
                sampling=sampling, args=args, **kwargs)
    return runs.DecodeReport(rows=[], new_rows=[], resumed=0, failed=[],
                             seconds=0.0, output=None)

  monkeypatch.setattr(runs, "run_decode", fake_decode)
  main.run()
  return seen


@pytest.mark.parametrize("path", _files("models"))
def test_model_files_build(path):
  if path.endswith("_common.gin"):
    main.parse_gin([path], REQUIRED)
    return
  main.parse_gin([path], REQUIRED)
  scope = os.path.basename(path)[:-4]
  with gin.config_scope(scope):
    spec = main.ModelSpec()
  assert spec.preset == scope and spec.preset in models.PRESETS
  assert spec.checkpoint and spec.tokenizer and spec.dtype == "bfloat16"


@pytest.mark.parametrize("path", _files("pairs"))
def test_pair_files_build(path, monkeypatch):
  seen = _build(["runs/decode.gin", path], REQUIRED, monkeypatch)
  for role in ("drafter", "verifier"):
    spec = seen[role]
    assert isinstance(spec, runs.ModelSpec) and spec.role == role
    assert spec.preset in models.PRESETS or spec.default_pair or (
        role == "drafter" and spec.is_ngram)


@pytest.mark.parametrize("path", _files("methods"))
def test_method_files_build(path, monkeypatch):
  seen = _build(["runs/decode.gin", "pairs/tiny_random.gin", path], (),
                monkeypatch)
  method = seen["method"]
  name = os.path.basename(path)[:-4]
  assert type(method) is type(decoding.make_method(name))
  method.validate()


def test_decode_run_file_builds(monkeypatch):
  seen = _build(["runs/decode.gin", "pairs/tiny_random.gin"], (), monkeypatch)
  assert isinstance(seen["sampling"], decoding.Temperature)


@pytest.mark.parametrize("path,mode", [("runs/eval.gin", "eval"),
                                       ("runs/bench.gin", "bench")])
def test_eval_and_bench_run_files_build(path, mode, monkeypatch):
  seen = {}
  monkeypatch.setattr(runs, "load_pair", lambda d, v, metrics, n: (
      seen.update(drafter=d, verifier=v, metrics=metrics, max_new=n) or
      type("P", (), {"verifier": models.get_model("gemma_tiny")})()))
  monkeypatch.setattr(runs, "load_examples", lambda *a, **k: (
      seen.update(dataset=a[0], limit=a[2]) or [{"id": "0"}]))
  monkeypatch.setattr(runs, "run_eval", lambda pair, ex, sweep, out, **k: (
      seen.update(sweep=sweep, out=out, repeats=k["repeats"])))
  main.parse_gin([path, "pairs/tiny_random.gin"],
                 ["EVAL_TASK = 'data.jsonl'", "EVAL_METRICS = ['bleu']"])
  main.run()
  assert seen["dataset"] == "data.jsonl" and seen["metrics"] == ["bleu"]
  assert seen["verifier"].preset == "gemma2_tiny"
  assert set(seen["sweep"]["methods"]) >= {"target_only", "spec_decode"}
  assert seen["repeats"] == (3 if mode == "bench" else 1)
  assert seen["out"] == f"results/{mode}"


def test_main_job_and_plan_run_files_build(monkeypatch):
  from specdec_jax.eval import main_job  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(main_job, "run_main_job",
                      lambda out, pairs=None, **kw: seen.update(out=out))
  main.parse_gin(["runs/main_job.gin"], ["OUTPUT_DIR = '/tmp/x'"])
  main.run()
  assert seen["out"] == "/tmp/x"
  gin.clear_config()
  main.parse_gin(["runs/plan.gin"], ["BATCHES = (1,)",
                                     "TOPOLOGIES = ('v4-8',)"])
  rows = main.run()
  from specdec_jax import plan  # pylint: disable=g-import-not-at-top
  # One row per default pair (T5, Gemma 2, Gemma 3) at one batch and topology.
  assert {r["batch"] for r in rows} == {1}
  assert len(rows) == len(plan.DEFAULT_PAIRS) == 3


def test_decode_run_end_to_end_on_tiny_models(tmp_path):
  req = tmp_path / "req.jsonl"
  req.write_text('{"tokens": [2, 5, 9]}\n{"tokens": [2, 7], "id": "b"}\n')
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin",
                  "methods/spec_decode.gin"],
                 [f"INPUT_FILE = '{req}'", f"OUTPUT_DIR = '{tmp_path}'",
                  "MAX_NEW_TOKENS = 6", "GAMMA = 2"])
  rows = main.run()
  assert [r["id"] for r in rows] == ["0", "b"]
  assert all(r["num_tokens"] == 6 for r in rows)
  lines = (tmp_path / "decodes.jsonl").read_text().splitlines()
  assert len(lines) == 2


def test_broken_binding_names_file_and_line(tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text("GAMMA = 3\nmethod_spec.nmae = 'chow'\n")
  with pytest.raises(ValueError, match=r"(?s)nmae.*bad.gin.*line 2"):
    main.parse_gin([str(bad)], [])


def test_missing_required_macro_is_reported(monkeypatch):
  with pytest.raises(ValueError, match="DRAFTER.*gin.REQUIRED"):
    _build(["runs/decode.gin"], (), monkeypatch)


@pytest.mark.parametrize("preset", sorted(models.PRESETS))
def test_model_configs_build(preset):
  cfg = model_configs.get_config(preset)
  built = model_configs.build(cfg)
  assert built.config == models.PRESETS[preset]


@pytest.mark.parametrize("name", ["paper_t5", "paper_gemma", "gamma_ablation",
                                  "main_job", "smoke"])
def test_sweep_configs_build(name):
  cfg = sweeps.get_config(name)
  for method, grid in cfg.methods.items():
    knobs = {k: v[0] for k, v in grid.items()}
    decoding.make_method(method, **knobs).validate()
  assert all(t >= 0 for t in cfg.temperatures) and cfg.gammas


@pytest.mark.parametrize("path", _files("trees"))
def test_tree_files_build(path, monkeypatch):
  seen = {}

  def fake_decode(*args, tree=None):
    seen.update(method=args[2], tree=tree)
    return runs.DecodeReport(rows=[], new_rows=[], resumed=0, failed=[],
                             seconds=0.0, output=None)

  monkeypatch.setattr(runs, "run_decode", fake_decode)
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin",
                  "methods/token_v3.gin", path], [])
  main.run()
  tree = seen["tree"]
  assert isinstance(tree, decoding.Tree)
  assert tree.topology.num_nodes >= 5 and tree.proposal in (
      "without_replacement", "iid", "top_k")
  assert type(seen["method"].target) is decoding.TokenV3


def test_plan_tree_run_file_builds(monkeypatch):
  from specdec_jax import plan_tree_run as plan_tree  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(plan_tree, "run_plan_tree",
                      lambda *a, **k: seen.update(args=a, kw=k))
  main.parse_gin(["runs/plan_tree.gin", "pairs/tiny_random.gin"],
                 ["MAX_NODES = 12", "TEMPERATURE = 1.0"])
  main.run()
  assert seen["kw"]["max_nodes"] == 12
  assert seen["args"][3].temperature == 1.0
  assert seen["kw"]["proposal"] == "without_replacement"


@pytest.mark.parametrize("path", _files("hierarchies"))
def test_hierarchy_files_build(path, monkeypatch):
  from specdec_jax import hierarchy_spec  # pylint: disable=g-import-not-at-top
  seen = {}

  def fake_decode(*args, hierarchy=None):
    seen.update(verifier=args[1], hierarchy=hierarchy)
    return runs.DecodeReport(rows=[], new_rows=[], resumed=0, failed=[],
                             seconds=0.0, output=None)

  monkeypatch.setattr(runs, "run_decode", fake_decode)
  name = os.path.basename(path)
  pair = next((f"pairs/{p}.gin" for p in ("default_gemma_completion",
                                          "default_t5_codegen")
               if p in name), "pairs/tiny_random.gin")
  main.parse_gin(["runs/decode.gin", pair, path], [])
  main.run()
  spec = seen["hierarchy"]
  assert isinstance(spec, hierarchy_spec.HierarchySpec)
  assert len(spec.buffers) == spec.depth == 2
  drafter = spec.drafters[0]
  assert isinstance(drafter, runs.ModelSpec) and drafter.role == "drafter"
  middle = spec.drafters[1]
  if name == "early_exit.gin":  # checkable without weights on tiny models
    assert middle == hierarchy_spec.EarlyExit(1)
    archs = spec.check(decoding.make_method("spec_decode"),
                       seen["verifier"].architecture())
    assert archs[1] == models.early_exit(models.get_model("gemma2_tiny"), 1)
  else:
    assert middle.role == "medium" and middle.default_pair == (
        seen["verifier"].default_pair)


def test_plan_hierarchy_run_file_builds(monkeypatch):
  from specdec_jax import plan_hierarchy_run as plan_hierarchy  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(plan_hierarchy, "run_plan_hierarchy",
                      lambda *a, **k: seen.update(args=a, kw=k))
  main.parse_gin(["runs/plan_hierarchy.gin", "pairs/tiny_random.gin"],
                 ["MAX_BUFFER = 4", "TEMPERATURE = 1.0"])
  main.run()
  verifier, candidates, sampling = seen["args"]
  assert verifier.preset == "gemma2_tiny"
  assert candidates[0].preset == "gemma_tiny" and candidates[1] == "exit:1"
  assert sampling.temperature == 1.0
  assert seen["kw"]["max_buffer"] == 4 and seen["kw"]["max_depth"] == 3
  assert seen["kw"]["planner"] == "auto"


@pytest.mark.parametrize("binding,want", [
    ("run.strategy = @chain()\nchain.gamma = 3", ("gamma", 3)),
    ("run.strategy = @tree()\ntree.kary = (2, 3)\ntree.proposal = 'top_k'",
     ("tree", decoding.Tree(decoding.Topology.kary(2, 3), "top_k"))),
    ("run.strategy = @stack()\nstack.drafters = [%DRAFTER, 'exit:1']\n"
     "stack.buffers = [2, 4]", ("hierarchy", (2, 4))),
])
def test_strategy_configurables_set_the_draft_structure(binding, want,
                                                       monkeypatch):
  """``run.strategy = @chain() / @tree() / @stack()`` reaches the decode
  run as its gamma, tree or hierarchy (one value instead of three knobs)."""
  seen = {}

  def fake_decode(*args, tree=None, hierarchy=None):
    seen.update(gamma=args[4], tree=tree, hierarchy=hierarchy)
    return runs.DecodeReport(rows=[], new_rows=[], resumed=0, failed=[],
                             seconds=0.0, output=None)

  monkeypatch.setattr(runs, "run_decode", fake_decode)
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin"],
                 binding.split("\n"))
  main.run()
  field, value = want
  got = seen[field]
  if field == "hierarchy":
    got = got.buffers
    assert seen["tree"] is None
  assert got == value


def test_strategy_and_tree_together_are_an_error(monkeypatch):
  monkeypatch.setattr(runs, "run_decode", lambda *a, **k: None)
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin"],
                 ["run.strategy = @chain()", "run.tree = @tree_spec()",
                  "tree_spec.chain = 3"])
  with pytest.raises(ValueError, match="run.strategy OR run.tree"):
    main.run()
