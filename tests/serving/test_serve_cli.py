"""`specdec_jax serve`: the gin run file builds the server's settings."""

import gin
import pytest

from specdec_jax import main
from specdec_jax.serving import cli as serve_cli


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize("pair", [None, "pairs/tiny_random.gin"])
def test_serve_run_file_builds(monkeypatch, pair):
  seen = {}
  monkeypatch.setattr(serve_cli, "serve_models",
                      lambda specs, **kw: seen.update(specs=specs, kw=kw))
  files = ["runs/serve.gin"] + ([pair] if pair else [])
  main.parse_gin(files, ["PORT = 8123", "SPECULATION = 'tree:2,2'"])
  main.run()
  assert seen["kw"]["port"] == 8123 and seen["kw"]["host"] == "127.0.0.1"
  assert seen["kw"]["speculation"] == "tree:2,2"
  roles = [s.role for s in seen["specs"]]
  assert roles == (["drafter", "verifier"] if pair else
                   ["drafter", "medium", "verifier"])
