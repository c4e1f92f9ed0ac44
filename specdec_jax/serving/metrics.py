"""Prometheus metrics of the server (text exposition format 0.0.4).

Counters: requests by outcome, prompt and generated tokens, drafted and
accepted tokens per level; gauges: queue length and busy slots; histograms:
time to first token, inter-token latency and request latency (seconds).
Names follow vLLM's where one exists (``*_time_to_first_token_seconds``).
"""

from __future__ import annotations

import bisect
import threading

PREFIX = "specdec"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)


class Histogram:
  """Cumulative-bucket histogram (Prometheus semantics)."""

  def __init__(self, buckets=_LATENCY_BUCKETS):
    self.buckets = tuple(buckets)
    self.counts = [0] * (len(self.buckets) + 1)
    self.sum = 0.0
    self.count = 0

  def observe(self, x: float) -> None:
    self.counts[bisect.bisect_left(self.buckets, x)] += 1
    self.sum += x
    self.count += 1

  def lines(self, name: str) -> list[str]:
    out, acc = [], 0
    for b, c in zip(self.buckets, self.counts):
      acc += c
      out.append(f'{name}_bucket{{le="{b}"}} {acc}')
    out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
    out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
    return out


class Metrics:
  """Thread-safe server metrics; ``render()`` gives the /metrics text."""

  def __init__(self, levels: int):
    self.levels = levels
    self._lock = threading.Lock()
    self.requests: dict[str, int] = {}
    self.prompt_tokens = 0
    self.generation_tokens = 0
    self.drafted = [0] * levels
    self.accepted = [0] * levels
    self.queue = 0
    self.busy_slots = 0
    self.ttft = Histogram()
    self.itl = Histogram()
    self.e2e = Histogram()

  def finished(self, outcome: str, prompt: int, generated: int, drafted,
               accepted, e2e: float | None) -> None:
    """One request ended (outcome: ok / cancelled / timeout / error /
    rejected)."""
    with self._lock:
      self.requests[outcome] = self.requests.get(outcome, 0) + 1
      self.prompt_tokens += prompt
      self.generation_tokens += generated
      for i, (d, a) in enumerate(zip(drafted or (), accepted or ())):
        self.drafted[i] += d
        self.accepted[i] += a
      if e2e is not None:
        self.e2e.observe(e2e)

  def first_token(self, seconds: float) -> None:
    with self._lock:
      self.ttft.observe(seconds)

  def inter_token(self, seconds: float, tokens: int) -> None:
    """A step emitted ``tokens`` tokens ``seconds`` after the previous one
    (each token counts once, at the step's latency per token)."""
    with self._lock:
      for _ in range(tokens):
        self.itl.observe(seconds / tokens)

  def set_load(self, queue: int, busy: int) -> None:
    with self._lock:
      self.queue, self.busy_slots = queue, busy

  def render(self) -> str:
    p = PREFIX
    with self._lock:
      lines = [f"# HELP {p}_requests_total Requests by outcome.",
               f"# TYPE {p}_requests_total counter"]
      for k in sorted(self.requests):
        lines.append(f'{p}_requests_total{{outcome="{k}"}} '
                     f"{self.requests[k]}")
      lines += [f"# TYPE {p}_prompt_tokens_total counter",
                f"{p}_prompt_tokens_total {self.prompt_tokens}",
                f"# TYPE {p}_generation_tokens_total counter",
                f"{p}_generation_tokens_total {self.generation_tokens}",
                f"# HELP {p}_spec_decode_num_draft_tokens_total Tokens the "
                f"level below proposed to each level.",
                f"# TYPE {p}_spec_decode_num_draft_tokens_total counter"]
      for i, d in enumerate(self.drafted):
        lines.append(f'{p}_spec_decode_num_draft_tokens_total{{level="{i}"}}'
                     f" {d}")
      lines += [f"# TYPE {p}_spec_decode_num_accepted_tokens_total counter"]
      for i, a in enumerate(self.accepted):
        lines.append(f"{p}_spec_decode_num_accepted_tokens_total"
                     f'{{level="{i}"}} {a}')
      lines += [f"# HELP {p}_spec_decode_acceptance_rate Accepted / drafted "
                f"tokens per level (NaN: none drafted).",
                f"# TYPE {p}_spec_decode_acceptance_rate gauge"]
      for i, (d, a) in enumerate(zip(self.drafted, self.accepted)):
        rate = a / d if d else float("nan")
        lines.append(f'{p}_spec_decode_acceptance_rate{{level="{i}"}} '
                     f"{rate:.6f}")
      lines += [f"# TYPE {p}_num_requests_waiting gauge",
                f"{p}_num_requests_waiting {self.queue}",
                f"# TYPE {p}_num_requests_running gauge",
                f"{p}_num_requests_running {self.busy_slots}"]
      for name, h, what in (
          ("time_to_first_token_seconds", self.ttft, "Time to first token."),
          ("inter_token_latency_seconds", self.itl, "Time per output token "
           "after the first."),
          ("e2e_request_latency_seconds", self.e2e, "Request latency.")):
        lines += [f"# HELP {p}_{name} {what}", f"# TYPE {p}_{name} histogram"]
        lines += h.lines(f"{p}_{name}")
    return "\n".join(lines) + "\n"
