"""AUC objectives for multi-label tasks, exactly as docs/algorithms.md section 1 defines them.

AUC square (1.1) and AUC-margin (1.2) min-max losses, pairwise X-risk with five surrogates (1.4),
KL-OPAUC with its functional pieces (1.5) plus CVaR-OPAUC and two-way KL-TPAUC, and the ratio loss
(1.6). The compositional inner step (1.3) is in ``models.compositional``. One module per section:
``minmax`` (1.1, 1.2), ``pairwise`` (1.4), ``partial_auc`` (1.5), ``ratio`` (1.6); ``batch`` holds what they
share. Import them from here.

Every AUC loss takes scores s = sigmoid(logit) in (0, 1) and labels of shape (N, C) (a 1-D batch is read
as C = 1), and per-disease parameters (a, b, alpha, prior) of shape (C,) or a scalar broadcast to all
diseases.

Missing labels. ``mask`` (N, C), bool or {0, 1} float, True = label present. A NaN label is treated as
masked too, so a shard's label columns (NaN = missing, docs/shards.md) can be passed as they are.

Edge cases (docs/algorithms.md section 0), the same for every AUC loss here:

* A disease whose batch has no present positive or no present negative is *undefined* for that batch
  (``defined_diseases``): its term is exactly 0 with zero gradient, never NaN. A disease masked
  everywhere is undefined. (The BCE losses need no pair: there only a disease without any present
  label contributes 0.)
* float16/bfloat16 scores are computed in float32 (the loss is float32; gradients flow back to the
  half-precision scores in their own dtype). The losses are polynomials or stable softplus/sigmoid
  expressions of bounded scores, so saturated scores (exactly 0 or 1) give finite values.
* Scores are not range-checked: the min-max losses are well defined for any real score (the engine's
  closed-form saddle tests use linear scores), but the margin m = 1 and the surrogates' defaults assume
  probabilities, so pass ``sigmoid(logits)``, not logits.

Reduction. ``reduction="mean"`` (the default) divides the sum of the per-disease terms by C, a
constant, so a disease's gradient does not change scale with how many other diseases happen to be
defined in the batch; ``"sum"`` adds them; ``"none"`` returns the (C,) vector of per-disease terms.
"""

from models.objectives.batch import Reduction, defined_diseases
from models.objectives.minmax import (
    ALPHA_MAX,
    auc_margin_dual_direction,
    auc_margin_loss,
    auc_margin_terms,
    auc_square_loss,
    auc_square_terms,
    clamp_alpha,
)
from models.objectives.pairwise import DEFAULT_TEMPERATURE, SURROGATES, Surrogate, get_surrogate, pairwise_auc_loss
from models.objectives.partial_auc import (
    CVaROPAUCLoss,
    KLOPAUCLoss,
    KLTPAUCLoss,
    cvar_opauc_surrogate,
    cvar_threshold_gradient,
    kl_opauc_ema,
    kl_opauc_inner_mean,
    kl_opauc_surrogate,
)
from models.objectives.ratio import RATIO_CAP, masked_bce_with_logits, ratio_loss, ratio_positive_weight

__all__ = [
    "ALPHA_MAX", "DEFAULT_TEMPERATURE", "RATIO_CAP", "SURROGATES", "CVaROPAUCLoss", "KLOPAUCLoss", "KLTPAUCLoss",
    "Reduction", "Surrogate", "auc_margin_dual_direction", "auc_margin_loss", "auc_margin_terms", "auc_square_loss", "auc_square_terms", "clamp_alpha",
    "cvar_opauc_surrogate", "cvar_threshold_gradient", "defined_diseases", "get_surrogate", "kl_opauc_ema",
    "kl_opauc_inner_mean", "kl_opauc_surrogate", "masked_bce_with_logits", "pairwise_auc_loss", "ratio_loss",
    "ratio_positive_weight",
]
