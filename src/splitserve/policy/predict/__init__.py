"""Output-length predictors: what a scheduler believes about how long a request will generate.

Owns one small Protocol (`OutputLengthPredictor`) and three implementations:

* `HistoryWindow` / `HistoryPredictor`: the empirical distribution of the last `w` finished output
  lengths (Past-Future, Gong et al. Eq. 1), with the artifact's conditional inverse-CDF sampler;
* `BucketedPredictor`: ALISE-style length buckets, a count model of P(output bucket | prompt
  bucket) learned online from (prompt_len, output_len) history (no ML framework);
* `OraclePredictor`: the true lengths, which only the simulator knows (`NoisyOraclePredictor`:
  the truth with a set mean relative error, standing in for a learned predictor of known
  accuracy).

`make_predictor(name)` builds one by name for an engine (`EngineModel(predictor=...)`, the
simulator's `WorkerTemplate.predictor`): "oracle", "oracle-noisy:<error>", "bucketed", "history".

All are pure (no I/O, no clock, no global state); randomness comes from a `random.Random` the
caller owns. Invariants tested (tests/unit/policy/predict): every prediction lies in
[max(1, generated), max_tokens]; history quantiles are monotone in q; the conditional sampler never
returns less than the generated length; the window is a FIFO of at most `w` lengths.
"""

from splitserve.policy.predict.base import LengthQuery, OutputLengthPredictor, clamp_prediction
from splitserve.policy.predict.bucketed import BucketedParams, BucketedPredictor
from splitserve.policy.predict.history import HistoryPredictor, HistoryWindow
from splitserve.policy.predict.oracle import NoisyOraclePredictor, OraclePredictor


def make_predictor(name: str, seed: int = 0) -> OutputLengthPredictor:
    """A fresh predictor by name (see the module docstring); raises `ValueError` if unknown."""
    kind, _, arg = name.partition(":")
    if kind == "oracle":
        return OraclePredictor()
    if kind == "oracle-noisy":
        return NoisyOraclePredictor(float(arg or "0.092"), seed)
    if kind == "bucketed":
        return BucketedPredictor()
    if kind == "history":
        return HistoryPredictor(HistoryWindow())
    raise ValueError(f"unknown predictor {name!r}")


__all__ = [
    "BucketedParams",
    "BucketedPredictor",
    "HistoryPredictor",
    "HistoryWindow",
    "LengthQuery",
    "NoisyOraclePredictor",
    "OraclePredictor",
    "OutputLengthPredictor",
    "clamp_prediction",
    "make_predictor",
]
