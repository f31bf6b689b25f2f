"""What a FedCache run was measured with: loss form, epoch rule, round-1 knowledge, indices.

The paper's forms became the simulator's defaults in issue 28 (:data:`DEFAULT_FORMS`; the
loss last, eq. 18 at T = 1, once converged runs measured it above isolated training in every
setting; docs/reproduction.md); runs written before carry a config without these keys and were
measured with the old forms (:data:`OLD_FORMS`). Pure
(no torch), so that the docs' renderer can say of each committed run what it measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The paper's forms.
PAPER_FORMS: dict[str, Any] = {"distill_form": "eq18", "local_epoch": "client",
                               "round1_knowledge": "zero", "index_bytes": 4}
#: The defaults of :class:`peerd.sim.knowledge.KnowledgeSimConfig`: the paper's.
DEFAULT_FORMS: dict[str, Any] = dict(PAPER_FORMS)
#: What a config without the keys was run with (every output before they existed).
OLD_FORMS: dict[str, Any] = {"distill_form": "code", "local_epoch": "mean",
                             "round1_knowledge": "none", "index_bytes": 0}

_LOSS = {"eq18": "eq. 18 (CE on τ(f) + β·KL(τ(f) ‖ τ(z̄)))",
         "code": "code (CE + β·T²·KL(τ(z̄) ‖ τ(f)))"}
_EPOCH = {"client": "ceil(n_k / B) steps per client", "mean": "ceil(mean n / B) steps for all"}
_ROUND1 = {"zero": "eq. 9 zeros", "none": "none (CE only)"}


def forms_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The four forms of a run's config block, the old ones for keys it lacks."""
    return {k: config.get(k, old) for k, old in OLD_FORMS.items()}


def describe(config: Mapping[str, Any]) -> str:
    """One phrase naming the forms a run was measured with."""
    f = forms_of(config)
    index = (f"+ {8 * f['index_bytes']}-bit index" if f["index_bytes"] else "no index")
    return (f"loss {_LOSS[f['distill_form']]}; epoch {_EPOCH[f['local_epoch']]}; round-1 "
            f"knowledge {_ROUND1[f['round1_knowledge']]}; traffic float16 logits {index}")
