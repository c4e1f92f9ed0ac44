"""Teacher-forced training of our T5 / Gemma models with optax.

A small, deterministic training loop for the built-in default models (and for
anyone fine-tuning a drafter on CPU or a single accelerator):

    model = models.T5Model(cfg)
    params = train.init_params(model, seed=0)
    result = train.train(model, params, train.TrainConfig(steps=2000),
                         train_batches=lambda start: stream(start),
                         eval_batches=val_batches, workdir="/tmp/run")

A batch is a dict of numpy arrays:

    inputs          [B, S] int32   encoder ids, 0-padded (encoder-decoder only)
    decoder_inputs  [B, T] int32   decoder ids (targets shifted right / the
                                   sequence without its last token)
    targets         [B, T] int32   ids to predict at each position
    weights         [B, T] float32 loss weight per position (0 on padding)

Distillation batches add the teacher's top-k log-probabilities (see
:func:`teacher_topk`):

    teacher_idx     [B, T, K] int32   the teacher's K most likely ids
    teacher_logp    [B, T, K] float32 their log-probabilities
    kl_weights      [B, T] float32    weight of KL(teacher || student) per
                                      position

The loss is the weighted mean token cross-entropy, plus, for distillation
batches, the weighted mean KL divergence from the teacher's top-k
distribution (renormalised over its K ids) to the student's. Optimizer: gradient
clipping by global norm, then AdamW (decay on >= 2-D leaves only) with a
linear-warmup / cosine-decay learning rate. The train step is jitted once per
batch shape; ``train`` logs progress, evaluates, keeps the best parameters and
writes a resumable checkpoint to ``workdir`` at every evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import zlib
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

Batch = Mapping[str, np.ndarray]
STATE_FILE = "train_state.npz"
BEST_FILE = "best_params.npz"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimizer and loop settings.

  Attributes:
    steps: total optimizer steps (the schedule's length).
    learning_rate: peak learning rate.
    warmup_steps: linear warmup from 0 to the peak.
    end_lr_fraction: final learning rate as a fraction of the peak.
    weight_decay: AdamW decoupled weight decay (on >= 2-D leaves).
    clip_norm: global gradient-norm clip.
    b1, b2: Adam moments.
    eval_every: steps between evaluations / checkpoints.
    log_every: steps between progress lines.
    seed: seed of the parameter init (see :func:`init_params`).
    cycle_lengths: warm restarts (SGDR): the lengths of successive
      schedule cycles, summing to ``steps`` (empty: one cycle of ``steps``).
      Each cycle warms up for ``warmup_steps``, then decays (cosine) to
      ``end_lr_fraction`` of its peak. A finished one-cycle run continued
      with ``cycle_lengths=(its steps, more)`` resumes exactly where it
      stopped.
    cycle_decay: cycle k peaks at ``learning_rate * cycle_decay**k``; each
      restart warms up from the previous cycle's final value.
    patience: stop early once this many evaluations in a row have not
      improved on the best evaluation loss (0: never stop early). The best
      parameters are what a run returns either way, so stopping changes
      them only if a later evaluation would have improved.
    update_scales: ``(module name, factor)`` pairs: the AdamW updates (weight
      decay included) of every parameter whose path contains that module
      name are multiplied by the factor. AdamW's step size does not depend
      on a parameter's scale, so a kernel initialised small on purpose (T5's
      ``query``, which holds the attention's 1/sqrt(head_dim): ``t5_layers``)
      moves sqrt(head_dim) times faster relative to its size than its
      neighbours; ``(("query", head_dim ** -0.5),)`` undoes that (t5x trains
      T5 with Adafactor, whose steps scale with the parameter instead).
      Empty: every parameter at the schedule's rate.
  """

  steps: int = 1000
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  end_lr_fraction: float = 0.1
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  b1: float = 0.9
  b2: float = 0.98
  eval_every: int = 250
  log_every: int = 50
  seed: int = 0
  cycle_lengths: tuple[int, ...] = ()
  cycle_decay: float = 1.0
  patience: int = 0
  update_scales: tuple[tuple[str, float], ...] = ()

  def __post_init__(self):
    for item in self.update_scales:
      if (not isinstance(item, (tuple, list)) or len(item) != 2 or
          not isinstance(item[0], str) or not isinstance(item[1], (int, float))
          or not item[1] > 0):
        raise ValueError(
            "update_scales must be (module name, factor > 0) pairs, e.g. "
            f"(('query', 0.125),); got {self.update_scales!r}")
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, got {self.steps}")
    if self.cycle_lengths and sum(self.cycle_lengths) != self.steps:
      raise ValueError(f"cycle_lengths must sum to steps={self.steps}, got "
                       f"{tuple(self.cycle_lengths)}")
    if not 0 < self.cycle_decay <= 1:
      raise ValueError(f"cycle_decay must be in (0, 1], got "
                       f"{self.cycle_decay}")
    shortest = min(self.cycle_lengths or (self.steps,))
    if not 0 <= self.warmup_steps < shortest:
      raise ValueError(f"warmup_steps must be in [0, shortest cycle = "
                       f"{shortest}), got {self.warmup_steps}")
    if self.learning_rate <= 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.eval_every < 1 or self.log_every < 1:
      raise ValueError("eval_every and log_every must be >= 1")
    if self.patience < 0:
      raise ValueError(f"patience must be >= 0 (0: no early stop), got "
                       f"{self.patience}")

  def out_of_patience(self, done: int, best_step: int) -> bool:
    """Whether a run at step ``done`` whose best evaluation was at
    ``best_step`` has gone ``patience`` evaluations without improving."""
    return self.patience > 0 and (done - best_step >= self.patience
                                  * self.eval_every)


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs.

  Attributes:
    step: [] int32 optimizer steps taken.
    params: the model's parameter tree.
    opt_state: optax state of :func:`make_optimizer`.
  """

  step: jax.Array
  params: dict
  opt_state: optax.OptState


@dataclasses.dataclass
class TrainResult:
  """Output of :func:`train`.

  Attributes:
    params: parameters with the best evaluation loss (the last ones when no
      evaluation batches were given).
    best_step: the step they come from.
    best_eval_loss: their mean token cross-entropy (nan without evaluation).
    history: one dict per log / evaluation line.
    seconds: wall time of this call (excluding earlier resumed runs).
  """

  params: dict
  best_step: int
  best_eval_loss: float
  history: list[dict]
  seconds: float


def init_params(model, seed: int = 0) -> dict:
  """Random parameters for training from scratch.

  ``model.init_params`` followed by :func:`scale_t5_queries`.

  Args:
    model: a T5Model or GemmaModel.
    seed: PRNG seed.
  """
  return scale_t5_queries(model, model.init_params(jax.random.PRNGKey(seed)))


def scale_t5_queries(model, params) -> dict:
  """T5 only: query kernels times ``head_dim ** -0.5`` (others unchanged).

  T5 attention has no 1/sqrt(head_dim) logit scaling; as in Mesh TensorFlow
  and t5x, the query kernels are initialised that much smaller instead, so
  initial attention logits are O(1). Gemma parameters are returned as is.
  """
  if not getattr(model, "is_encoder_decoder", False):
    return params
  scale = model.config.head_dim ** -0.5
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  flat = {k: v * scale if k.endswith("query/kernel") else v
          for k, v in flat.items()}
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def schedule(cfg: TrainConfig) -> optax.Schedule:
  """Warmup + cosine decay per cycle (see :class:`TrainConfig`)."""
  lengths = tuple(cfg.cycle_lengths) or (cfg.steps,)
  parts, start = [], 0.0
  for k, length in enumerate(lengths):
    peak = cfg.learning_rate * cfg.cycle_decay ** k
    parts.append(optax.warmup_cosine_decay_schedule(
        start, peak, cfg.warmup_steps, length,
        end_value=peak * cfg.end_lr_fraction))
    start = peak * cfg.end_lr_fraction
  if len(parts) == 1:
    return parts[0]
  return optax.join_schedules(parts, list(np.cumsum(lengths[:-1])))


def update_scale(cfg: TrainConfig, path) -> float:
  """The factor ``cfg.update_scales`` gives the parameter at ``path``.

  Args:
    cfg: the training config.
    path: a ``jax.tree_util`` key path (or a tuple of names).

  Returns:
    The product of the factors of the module names on the path (1.0: none).
  """
  names = {str(getattr(k, "key", getattr(k, "name", k))) for k in path}
  return float(np.prod([f for n, f in cfg.update_scales if n in names]))


def _scale_updates(cfg: TrainConfig) -> optax.GradientTransformation:
  """Multiplies each parameter's update by :func:`update_scale`."""

  def scale(path, u):
    factor = update_scale(cfg, path)  # trace time: a Python float
    return u if factor == 1.0 else u * factor

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(scale, updates), state
  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW with :func:`schedule` (then the
  per-module ``cfg.update_scales``, if any)."""
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
  chain = [optax.clip_by_global_norm(cfg.clip_norm),
           optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                       weight_decay=cfg.weight_decay, mask=decay_mask)]
  if cfg.update_scales:
    chain.append(_scale_updates(cfg))
  return optax.chain(*chain)


def learning_rate(cfg: TrainConfig, step: int) -> float:
  """The schedule's value at ``step`` (for logs)."""
  return float(schedule(cfg)(step))


def init_state(params, cfg: TrainConfig) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=make_optimizer(cfg).init(params))


def cross_entropy(logits: jax.Array, targets: jax.Array,
                  weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Weighted token cross-entropy.

  Args:
    logits: [B, T, V] float32.
    targets: [B, T] int32.
    weights: [B, T] float32.

  Returns:
    (sum of weighted negative log-likelihoods [], sum of weights []).
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * weights), jnp.sum(weights)  # [B, T] -> []


TEACHER_KEYS = ("teacher_idx", "teacher_logp", "kl_weights")


def kl_to_teacher(logits: jax.Array, teacher_idx: jax.Array,
                  teacher_logp: jax.Array,
                  kl_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Weighted KL(teacher || student) over the teacher's top-k ids.

  The teacher's K log-probabilities are renormalised over those K ids; the
  student's are its full-vocabulary log-probabilities at the same ids.

  Args:
    logits: [B, T, V] student logits.
    teacher_idx: [B, T, K] int32.
    teacher_logp: [B, T, K] float32.
    kl_weights: [B, T] float32.

  Returns:
    (sum of weighted KL [], sum of weights []).
  """
  logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  logq = jnp.take_along_axis(logq, teacher_idx, axis=-1)  # [B, T, K]
  logp = jax.nn.log_softmax(teacher_logp.astype(jnp.float32), axis=-1)
  kl = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)  # [B, T, K] -> [B, T]
  return jnp.sum(kl * kl_weights), jnp.sum(kl_weights)


def batch_loss(model, params, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """(sum nll, sum weights) of one batch under ``model.forward``."""
  logits = model.forward(params, batch["decoder_inputs"],
                         inputs=batch.get("inputs"))  # [B, T, V]
  return cross_entropy(logits, batch["targets"], batch["weights"])


def batch_terms(model, params, batch: Batch) -> dict[str, jax.Array]:
  """Sums of the objective's terms on one batch.

  Returns:
    {'nll', 'weights'} (cross-entropy) and, for a distillation batch,
    {'kl', 'kl_weights'}; every value a [] float32 sum.
  """
  logits = model.forward(params, batch["decoder_inputs"],
                         inputs=batch.get("inputs"))  # [B, T, V]
  nll, weights = cross_entropy(logits, batch["targets"], batch["weights"])
  terms = dict(nll=nll, weights=weights)
  if "teacher_idx" in batch:
    terms["kl"], terms["kl_weights"] = kl_to_teacher(
        logits, batch["teacher_idx"], batch["teacher_logp"],
        batch["kl_weights"])
  return terms


def objective(terms: Mapping[str, jax.Array]) -> jax.Array:
  """Mean cross-entropy + mean KL (each over its own weights; 0 if none)."""
  loss = terms["nll"] / jnp.maximum(terms["weights"], 1.0)
  if "kl" in terms:
    loss = loss + terms["kl"] / jnp.maximum(terms["kl_weights"], 1.0)
  return loss


@functools.lru_cache(maxsize=16)
def make_train_step(model, cfg: TrainConfig):
  """Jitted ``(state, batch) -> (state, metrics)``; the state is donated.

  Cached per (model, cfg), so repeated runs reuse the compiled program.
  """
  optimizer = make_optimizer(cfg)

  def loss_fn(params, batch):
    terms = batch_terms(model, params, batch)
    return objective(terms), terms

  def step_fn(state: TrainState, batch):
    (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state,
                                          state.params)
    params = optax.apply_updates(state.params, updates)
    used = batch["weights"] > 0
    if "kl_weights" in batch:
      used = used | (batch["kl_weights"] > 0)
    metrics = dict(loss=loss, tokens=jnp.sum(used.astype(jnp.float32)),
                   grad_norm=optax.global_norm(grads))
    return TrainState(step=state.step + 1, params=params,
                      opt_state=opt_state), metrics

  return jax.jit(step_fn, donate_argnums=0)


@functools.lru_cache(maxsize=16)
def make_eval_step(model):
  """Jitted ``(params, batch) -> (sum nll [], sum weights [])``."""
  return jax.jit(lambda params, batch: batch_loss(model, params, batch))


@functools.lru_cache(maxsize=16)
def make_terms_step(model):
  """Jitted ``(params, batch) -> batch_terms(...)``."""
  return jax.jit(lambda params, batch: batch_terms(model, params, batch))


def evaluate(eval_step, params, batches: Iterable[Batch]) -> float:
  """Mean token cross-entropy over ``batches`` (nan if they are empty)."""
  total = count = 0.0
  for b in batches:
    t, c = eval_step(params, b)
    total, count = total + float(t), count + float(c)
  return total / count if count else float("nan")


def evaluate_objective(terms_step, params,
                       batches: Iterable[Batch]) -> float:
  """The training objective over ``batches``: mean cross-entropy (+ mean
  KL to the teacher on distillation batches); nan if they are empty."""
  sums: dict[str, float] = {}
  for b in batches:
    for k, v in terms_step(params, b).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  if not sums.get("weights") and not sums.get("kl_weights"):
    return float("nan")
  return float(objective({k: jnp.float32(v) for k, v in sums.items()}))


@functools.lru_cache(maxsize=16)
def make_teacher_topk(model, k: int):
  """Jitted ``(params, batch) -> (logp [B, T, k] float32, ids [B, T, k]
  int32)``: the ``k`` most likely next ids at every position (teacher
  forcing on ``batch['decoder_inputs']``) and their log-probabilities."""

  def fn(params, batch):
    logits = model.forward(params, batch["decoder_inputs"],
                           inputs=batch.get("inputs"))  # [B, T, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jax.lax.top_k(logp, k)  # [B, T, V] -> 2 x [B, T, k]

  return jax.jit(fn)


def truncate_decoder(model, params, num_layers: int):
  """A smaller model made of the first ``num_layers`` decoder layers.

  Gemma: layers ``0..num_layers-1``, the embedding and the final norm; T5:
  the whole encoder, the first decoder layers, the decoder's final norm,
  relative-position bias and LM head. The parameters are copies (a model of
  its own, e.g. to initialise a distilled drafter), unlike
  ``models.early_exit`` which reads the base model's tree.

  Args:
    model: a T5Model or GemmaModel.
    params: its parameters.
    num_layers: decoder layers to keep, 1..the model's.

  Returns:
    (model, params) of the truncated model.
  """
  from specdec_jax import models as models_lib  # pylint: disable=g-import-not-at-top
  cfg = model.config
  have = (cfg.num_decoder_layers if model.is_encoder_decoder
          else cfg.num_layers)
  if not 1 <= num_layers <= have:
    raise ValueError(f"num_layers must be in [1, {have}] (the model's "
                     f"decoder layers), got {num_layers}")
  copy = lambda tree: jax.tree.map(np.array, tree)
  if model.is_encoder_decoder:
    new_cfg = dataclasses.replace(cfg, num_decoder_layers=num_layers)
    dec = {k: v for k, v in params["decoder"].items()
           if not k.startswith("layers_") or int(k[7:]) < num_layers}
    new = {**params, "decoder": dec}
  else:
    new_cfg = dataclasses.replace(
        cfg, num_layers=num_layers,
        attention_types=tuple(cfg.attention_types[:num_layers]))
    new = {k: v for k, v in params.items()
           if not k.startswith("layer_") or int(k[6:]) < num_layers}
  small = models_lib.model_from_config(new_cfg)
  new = copy(new)
  small.check_params(new)
  return small, new


# ------------------------------------------------------------------ batches


def _bucket(n: int, buckets: Sequence[int]) -> int:
  for b in buckets:
    if n <= b:
      return b
  return buckets[-1]


def seq2seq_batch(pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                  input_buckets: Sequence[int],
                  target_buckets: Sequence[int], eos_id: int,
                  decoder_start_id: int = 0, pad_id: int = 0) -> Batch:
  """Encoder-decoder batch; targets get EOS, inputs/targets are truncated.

  Args:
    pairs: [(input ids, target ids)] without EOS.
    input_buckets: increasing encoder widths; the batch uses the smallest
      that fits its longest input (inputs longer than the last are cut).
    target_buckets: the same for targets + EOS.
    eos_id: appended to every target (kept even when truncating).
    decoder_start_id: first decoder input token.
    pad_id: padding id (weight 0).
  """
  if not pairs:
    raise ValueError("seq2seq_batch needs at least one (inputs, targets) pair")
  s = _bucket(max(len(x) for x, _ in pairs), input_buckets)
  t = _bucket(max(len(y) + 1 for _, y in pairs), target_buckets)
  b = len(pairs)
  inputs = np.full((b, s), pad_id, np.int32)
  targets = np.full((b, t), pad_id, np.int32)
  weights = np.zeros((b, t), np.float32)
  for i, (x, y) in enumerate(pairs):
    x = list(x)[:s]
    y = list(y)[:t - 1] + [eos_id]
    inputs[i, :len(x)] = x
    targets[i, :len(y)] = y
    weights[i, :len(y)] = 1.0
  dec = np.full((b, t), pad_id, np.int32)
  dec[:, 0] = decoder_start_id
  dec[:, 1:] = targets[:, :-1]  # [B, T]: shifted right
  return dict(inputs=inputs, decoder_inputs=dec, targets=targets,
              weights=weights)


def decoder_token_dropout(batch: Batch, rate: float, token_id: int,
                          seed: int = 0) -> Batch:
  """Replaces about ``rate`` of the decoder's input tokens by ``token_id``.

  Word dropout (Bowman et al., 2016): the decoder sees a corrupted history,
  so predicting the next target from the history alone (a language model of
  the targets) works less well and an encoder-decoder model leans on its
  encoder input instead. Targets and weights are unchanged; position 0 (the
  decoder start or BOS) and positions whose target has weight 0 (padding)
  keep their tokens. The corruption is a function of the batch's contents
  and ``seed`` only, so a resumed stream corrupts every batch as the
  uninterrupted run did.

  Args:
    batch: a :func:`seq2seq_batch` or :func:`lm_batch` batch
      (``decoder_inputs`` [B, T], ``weights`` [B, T]).
    rate: replacement probability per eligible position, in [0, 1).
    token_id: the id written (e.g. the tokenizer's unknown-piece id).
    seed: stage seed.

  Returns:
    The batch with new ``decoder_inputs`` [B, T] (the input is not changed).
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"decoder token dropout rate must be in [0, 1), got "
                     f"{rate}")
  if rate == 0.0:
    return batch
  dec = np.asarray(batch["decoder_inputs"])
  key = zlib.crc32(dec.tobytes()) ^ zlib.crc32(
      np.asarray(batch["targets"]).tobytes())
  rng = np.random.default_rng([seed, key])
  drop = (rng.random(dec.shape) < rate) & (np.asarray(batch["weights"]) > 0)
  drop[:, 0] = False
  return dict(batch, decoder_inputs=np.where(drop, token_id, dec).astype(
      dec.dtype))


def lm_batch(rows: Sequence[tuple[Sequence[int], Sequence[int]]],
             buckets: Sequence[int], eos_id: int | None,
             prompt_weight: float = 1.0, pad_id: int = 0) -> Batch:
  """Decoder-only batch of prompt + continuation (+ EOS).

  The sequence ``prompt + target (+ [eos])`` is cut to the bucket width + 1;
  ``decoder_inputs`` is the sequence without its last token and ``targets``
  without its first. Predicting a target token (or the EOS) has weight 1,
  predicting a later prompt token ``prompt_weight``.

  Args:
    rows: [(prompt ids, target ids)]; prompts should start with BOS.
    buckets: increasing widths (positions predicted per row).
    eos_id: appended to every row, or None for raw text windows.
    prompt_weight: loss weight of the prompt tokens.
    pad_id: padding id (weight 0).
  """
  if not rows:
    raise ValueError("lm_batch needs at least one (prompt, target) row")
  extra = 0 if eos_id is None else 1
  t = _bucket(max(len(p) + len(y) + extra - 1 for p, y in rows), buckets)
  b = len(rows)
  seq = np.full((b, t + 1), pad_id, np.int32)
  weights = np.zeros((b, t), np.float32)
  for i, (p, y) in enumerate(rows):
    full = list(p) + list(y) + ([] if eos_id is None else [eos_id])
    full = full[:t + 1]
    seq[i, :len(full)] = full
    n_prompt = max(len(p) - 1, 0)  # predictions of prompt tokens 1..P-1
    weights[i, :len(full) - 1] = 1.0
    weights[i, :min(n_prompt, len(full) - 1)] = prompt_weight
  return dict(decoder_inputs=seq[:, :-1], targets=seq[:, 1:],
              weights=weights)


def bucketed_stream(items: Sequence, make_batch: Callable[[list], Batch],
                    batch_size: int, length: Callable[[object], int],
                    seed: int, start_step: int = 0,
                    sort_window: int = 32) -> Iterator[Batch]:
  """Endless deterministic batches, epoch after epoch.

  Each epoch shuffles ``items`` with ``seed + epoch``, drops the last
  ``len(items) % batch_size`` of them, sorts windows of ``sort_window``
  batches by length (less padding), and shuffles the batch order. The
  stream from ``start_step`` equals the full stream with its first
  ``start_step`` batches dropped (for resuming).

  Args:
    items: examples (anything ``make_batch`` accepts a list of).
    make_batch: list of items -> Batch.
    batch_size: items per batch (<= len(items)).
    length: item -> length used for sorting.
    seed: base seed.
    start_step: batches to skip.
    sort_window: batches per sorted window.
  """
  if not 1 <= batch_size <= len(items):
    raise ValueError(f"batch_size must be in [1, {len(items)}] (the number "
                     f"of items), got {batch_size}")
  step, epoch = 0, 0
  while True:
    rng = np.random.default_rng(seed + epoch)
    order = rng.permutation(len(items))
    order = order[:len(order) - len(order) % batch_size]  # random leftovers
    chunks = []
    w = batch_size * sort_window
    for lo in range(0, len(order), w):
      window = sorted(order[lo:lo + w], key=lambda i: length(items[i]))
      chunks += [window[j:j + batch_size]
                 for j in range(0, len(window), batch_size)]
    for k in rng.permutation(len(chunks)):
      if step >= start_step:
        yield make_batch([items[i] for i in chunks[k]])
      step += 1
    epoch += 1


# -------------------------------------------------------------- checkpoints


def _save_tree(path: str, tree, **extra) -> None:
  leaves = jax.tree.leaves(tree)
  arrays = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
  tmp = path + ".tmp.npz"
  np.savez(tmp, **arrays, **{k: np.asarray(v) for k, v in extra.items()})
  os.replace(tmp, path)


def _load_tree(path: str, like):
  with np.load(path) as data:
    leaves, treedef = jax.tree.flatten(like)
    names = sorted(k for k in data.files if k.startswith("leaf_"))
    if len(names) != len(leaves):
      raise ValueError(f"{path} holds {len(names)} arrays, the state has "
                       f"{len(leaves)}; it comes from another model or "
                       f"optimizer: delete it to start over")
    new = []
    for name, ref in zip(names, leaves):
      arr = data[name]
      if arr.shape != np.shape(ref):
        raise ValueError(f"{path}: {name} has shape {arr.shape}, expected "
                         f"{np.shape(ref)}; delete it to start over")
      new.append(jnp.asarray(arr, dtype=jnp.asarray(ref).dtype))
    extra = {k: data[k] for k in data.files if not k.startswith("leaf_")}
  return jax.tree.unflatten(treedef, new), extra


def save_state(workdir: str, state: TrainState, best_step: int,
               best_loss: float, history: list[dict]) -> None:
  """Writes the resumable state (and the history as JSON) to ``workdir``."""
  os.makedirs(workdir, exist_ok=True)
  _save_tree(os.path.join(workdir, STATE_FILE), state, best_step=best_step,
             best_loss=best_loss)
  with open(os.path.join(workdir, "history.json"), "w") as f:
    json.dump(history, f)


def restore_state(workdir: str, like: TrainState):
  """(state, best_step, best_loss, history) from ``workdir``, or None."""
  path = os.path.join(workdir, STATE_FILE)
  if not os.path.isfile(path):
    return None
  state, extra = _load_tree(path, like)
  hist_path = os.path.join(workdir, "history.json")
  history = []
  if os.path.isfile(hist_path):
    with open(hist_path) as f:
      history = json.load(f)
  return (state, int(extra["best_step"]), float(extra["best_loss"]),
          history)


# --------------------------------------------------------------------- loop


def train(model, params, cfg: TrainConfig,
          train_batches: Callable[[int], Iterator[Batch]],
          eval_batches: Sequence[Batch] = (), workdir: str | None = None,
          log: Callable[[str], None] | None = print,
          on_eval: Callable[[int, dict, float], None] | None = None
          ) -> TrainResult:
  """Trains ``model`` from ``params`` for ``cfg.steps`` steps.

  With ``workdir``, a run that finds ``workdir/train_state.npz`` resumes from
  it (same data order: ``train_batches(step)`` must give the stream from that
  step), and every evaluation rewrites the state, the history and, when the
  evaluation loss improves, ``workdir/best_params.npz``.

  Args:
    model: T5Model / GemmaModel (float32 parameters recommended).
    params: initial parameters (ignored when resuming).
    cfg: TrainConfig.
    train_batches: start step -> iterator of training batches.
    eval_batches: fixed evaluation batches (may be empty).
    workdir: optional directory for resumable checkpoints.
    log: progress printer (None for silence).
    on_eval: called as ``on_eval(step, params, eval loss)`` after every
      evaluation (host parameters; before the state is checkpointed, so a
      run killed in between repeats that evaluation and the call), e.g. to
      keep every evaluated checkpoint for a later model selection.

  Returns:
    TrainResult with the best parameters.
  """
  say = log or (lambda s: None)
  model.check_params(params)
  # The train step donates its state: copy, so the caller's params survive.
  state = init_state(jax.tree.map(jnp.array, params), cfg)
  best_params, best_step, best_loss, history = params, 0, float("inf"), []
  if workdir is not None:
    restored = restore_state(workdir, state)
    if restored is not None:
      state, best_step, best_loss, history = restored
      best_path = os.path.join(workdir, BEST_FILE)
      if os.path.isfile(best_path):
        best_params, _ = _load_tree(best_path, params)
      else:
        best_params = state.params
      say(f"resumed from {workdir} at step {int(state.step)}")
  start = int(state.step)
  train_step = make_train_step(model, cfg)
  terms_step = make_terms_step(model)
  stream = train_batches(start)
  t0 = time.perf_counter()
  window_t, window_tokens, losses = t0, 0.0, []
  for step in range(start, cfg.steps):
    if eval_batches and cfg.out_of_patience(step, best_step):
      say(f"early stop at step {step}: {cfg.patience} evaluations without "
          f"improvement (best {best_loss:.4f} at {best_step})")
      break
    batch = next(stream)
    state, metrics = train_step(state, batch)
    losses.append(metrics["loss"])
    window_tokens += float(metrics["tokens"])
    done = step + 1
    if done % cfg.log_every == 0 or done == cfg.steps:
      now = time.perf_counter()
      row = dict(step=done, loss=float(np.mean(jax.device_get(losses))),
                 grad_norm=float(metrics["grad_norm"]),
                 lr=learning_rate(cfg, done),
                 tokens_per_s=window_tokens / max(now - window_t, 1e-9),
                 elapsed_s=now - t0)
      history.append(row)
      say(f"step {done}/{cfg.steps} loss {row['loss']:.4f} grad "
          f"{row['grad_norm']:.3f} lr {row['lr']:.2e} "
          f"{row['tokens_per_s']:.0f} tok/s {row['elapsed_s']:.0f}s")
      window_t, window_tokens, losses = now, 0.0, []
    if eval_batches and (done % cfg.eval_every == 0 or done == cfg.steps):
      loss = evaluate_objective(terms_step, state.params, eval_batches)
      history.append(dict(step=done, eval_loss=loss))
      improved = loss < best_loss
      if improved:
        best_loss, best_step = loss, done
        best_params = jax.device_get(state.params)
      best = (" (best)" if improved else
              f" (best {best_loss:.4f} at {best_step})")
      say(f"step {done} eval loss {loss:.4f}{best}")
      if on_eval is not None:
        on_eval(done, jax.device_get(state.params), loss)
      if workdir is not None:
        if improved:
          os.makedirs(workdir, exist_ok=True)
          _save_tree(os.path.join(workdir, BEST_FILE), best_params)
        save_state(workdir, state, best_step, best_loss, history)
  if not eval_batches:
    best_params, best_step, best_loss = state.params, int(state.step), \
        float("nan")
    if workdir is not None:
      save_state(workdir, state, best_step, best_loss, history)
  return TrainResult(params=jax.device_get(best_params), best_step=best_step,
                     best_eval_loss=best_loss, history=history,
                     seconds=time.perf_counter() - t0)


__all__ = [
    "Batch", "TEACHER_KEYS", "TrainConfig", "TrainResult", "TrainState",
    "batch_loss", "batch_terms", "bucketed_stream", "cross_entropy",
    "decoder_token_dropout",
    "evaluate", "evaluate_objective", "init_params", "init_state",
    "kl_to_teacher", "learning_rate", "lm_batch", "make_eval_step",
    "make_optimizer", "make_teacher_topk", "make_terms_step",
    "make_train_step", "objective", "restore_state", "save_state",
    "schedule", "scale_t5_queries", "seq2seq_batch", "train",
    "truncate_decoder",
]
