"""Pure rendering for the app: coloured token HTML, statistics, draft-tree and LSA figures.

Everything here takes plain data (the JSON form of `core.decoding.StepEvent`,
i.e. `StepEvent.to_dict()`) and returns HTML strings, dicts or plotly figures,
so it can be tested on hand-made traces without Gradio or a model.

Vocabulary used below: an event is one target forward pass. Its `new_tokens`
are the accepted draft tokens (node indices in `accepted`, depth 1, 2, ...)
followed by the target's own token (the "bonus" or correction token). Step 0
is the prefill, whose only token is the target's own.

The modules, by what they draw: `style` (colours, CSS, the empty figure), `tokens` (the coloured token
stream), `stats` (tau, speed and speedup), `compare` (runs side by side, why texts differ), `trees` (one
step's draft tree), `lsa` (MoA's layer self-attention), `cost` (the cost curve and the tree-shape choice).
Every public name is exported here: `from demo.render import X` and `render.X` work for all of them.
"""

from demo.render.compare import (
    NEAR_TIE,
    compare_html,
    divergence_html,
    first_difference,
    lossless_note,
    token_row,
    top2_at,
)
from demo.render.cost import cost_curve_figure, tree_choice_figure
from demo.render.lsa import lsa_bar, lsa_heatmap, lsa_matrices, lsa_received
from demo.render.stats import CURVE_LINK, generation_stats, speed_context, stats_html
from demo.render.style import (
    ACCEPTED_GREEN,
    BONUS_COLOUR,
    BONUS_ORANGE,
    CSS,
    DEPTH_COLOURS,
    MAX_DEPTH_CLASS,
    REJECTED_GREY,
    ROOT_BLUE,
    message_figure,
)
from demo.render.tokens import (
    event_tokens,
    legend_html,
    token_pieces,
    token_span,
    token_title,
    tokens_from_events,
    tokens_html,
)
from demo.render.trees import default_step, show_token, step_choices, tree_figure, tree_layout

__all__ = [
    "ACCEPTED_GREEN", "BONUS_COLOUR", "BONUS_ORANGE", "CSS", "CURVE_LINK", "DEPTH_COLOURS", "MAX_DEPTH_CLASS",
    "NEAR_TIE", "REJECTED_GREY", "ROOT_BLUE",
    "compare_html", "cost_curve_figure", "default_step", "divergence_html", "event_tokens", "first_difference",
    "generation_stats", "legend_html", "lossless_note", "lsa_bar", "lsa_heatmap", "lsa_matrices", "lsa_received",
    "message_figure", "show_token", "speed_context", "stats_html", "step_choices", "token_pieces", "token_row",
    "token_span", "token_title", "tokens_from_events", "tokens_html", "top2_at", "tree_choice_figure",
    "tree_figure", "tree_layout",
]
