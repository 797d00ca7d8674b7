"""The look shared by the renderers: token colours by draft depth, the figure colours, the app's CSS, and the
figure that says why there is nothing to plot."""

from __future__ import annotations

import plotly.graph_objects as go

MAX_DEPTH_CLASS = 8  # depth classes d1..d8; deeper drafts share d8

# Greens darken with draft depth; the target's own tokens are peach. Text stays readable in dark mode.
DEPTH_COLOURS = ["#cdeedb", "#b3e5c6", "#9edcb6", "#7acb9b", "#56b981", "#3a9d68", "#2a7f53", "#1d6141"]
BONUS_COLOUR = "#fdd9b5"
ACCEPTED_GREEN = "#2a9d5c"
REJECTED_GREY = "#b8bcc4"
BONUS_ORANGE = "#f08a24"
ROOT_BLUE = "#3b5bdb"

CSS = "\n".join(
    [
        ".tok-stream { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px;"
        " line-height: 1.9; white-space: pre-wrap; word-break: break-word; padding: 8px;"
        " border: 1px solid #d0d4da; border-radius: 8px; min-height: 48px; background: #ffffff; color: #111; }",
        ".tok { border-radius: 3px; padding: 1px 0; margin-right: 1px; color: #111; cursor: help; }",
        f".tok-bonus {{ background: {BONUS_COLOUR}; box-shadow: inset 0 -2px 0 {BONUS_ORANGE}; }}",
        ".tok-special { font-size: 11px; opacity: 0.75; }",
        *[f".tok-draft.d{i + 1} {{ background: {c};{' color: #fff;' if i >= 5 else ''} }}"
          for i, c in enumerate(DEPTH_COLOURS)],
        ".tok-legend { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; font-size: 12px;"
        " margin: 4px 0 6px 0; color: inherit; }",
        ".tok-legend .tok { padding: 1px 6px; }",
        ".stat-cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(110px, 1fr)); gap: 6px; }",
        ".stat-card { border: 1px solid #d0d4da; border-radius: 8px; padding: 6px 8px; background: #f7f8fa;"
        " color: #111; }",
        ".stat-card .v { font-size: 20px; font-weight: 600; }",
        ".stat-card .k { font-size: 11px; opacity: 0.8; }",
        ".stat-note { font-size: 12px; margin-top: 4px; }",
        ".cmp-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 10px; }",
        ".cmp-col h4 { margin: 4px 0; }",
        ".cmp-ok { color: #1d7a46; font-weight: 600; }",
        ".cmp-diff { color: #b54708; font-weight: 600; }",
        ".untrained-note { background: #fff4e5; color: #7a4100; border: 1px solid #f5c27a; border-radius: 6px;"
        " padding: 4px 8px; font-size: 13px; }",
        ".tok-now { outline: 2px solid #f08a24; outline-offset: 0; }",
        ".cmp-why { border-left: 3px solid #b54708; padding: 4px 8px; margin: 6px 0; font-size: 13px; }",
        ".load-status { font-size: 13px; padding: 4px 8px; border-radius: 6px; background: #eef2ff; color: #1e2a5a; }",
        ".load-status.ready { background: #e6f6ec; color: #14532d; }",
        ".load-status.failed { background: #fdecea; color: #7a1c1c; }",
        ".example-note { font-size: 13px; opacity: 0.85; margin: 2px 0 4px 0; }",
        ".verdict-table { border-collapse: collapse; font-size: 12px; width: 100%; }",
        ".verdict-table td, .verdict-table th { border-bottom: 1px solid #e3e6ea; padding: 2px 6px;"
        " text-align: left; }",
        ".verdict-wrap { max-height: 300px; overflow: auto; }",
        ".v-acc { color: #1d7a46; font-weight: 600; } .v-rej { color: #9a3412; } .v-skip { opacity: 0.6; }",
        ".bench-table { overflow-x: auto; } .bench-table table { font-size: 12px; margin: 0; }",
        ".bench-table td, .bench-table th { padding: 3px 6px !important; }",
        # phones: no horizontal page scroll; plots, tables and rows shrink to the screen. (Gradio scopes these
        # rules under the app's root element, so they name inner classes only.)
        ".js-plotly-plot, .plot-container, .svg-container { max-width: 100% !important; }",
        "@media (max-width: 640px) {"
        " .row, .form { flex-wrap: wrap !important; }"
        " .row > *, .row > .form > * { min-width: 100% !important; flex: 1 1 100% !important; }"
        " .stat-cards { grid-template-columns: repeat(auto-fill, minmax(92px, 1fr)); }"
        " .stat-card .v { font-size: 16px; }"
        " .cmp-grid { grid-template-columns: 1fr; }"
        " .prose table, .bench-table table { display: block; overflow-x: auto; }"
        " }",
    ]
)


def message_figure(text: str) -> go.Figure:
    """An empty figure that says why there is nothing to plot."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#666"})
    fig.update_layout(height=260, xaxis={"visible": False}, yaxis={"visible": False}, plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fig
