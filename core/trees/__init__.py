"""Draft trees: the structure, this machine's cost of verifying them, and how `auto` trees are sized.

    draft_tree    DraftTree, the tree every drafter hands to the verifier
    cost_curve    this machine's cost curve (one target pass against its tokens) and the matmul floor
    acceptance    the measured acceptance a tree choice goes by (tree table, benchmark summaries, drafter cards)
    choice        the model behind `auto` trees: the (depth, total_tokens) with the best expected tokens/s
    calibration   an `auto` tree corrected by its decoded cycles (CycleLedger, calibrate_dynamic_tree)
    trial         an `auto` tree decided by decoding: candidate shapes take turns, measured tokens/s wins

Import the modules themselves (`from core.trees.choice import choose_tree`); this file imports nothing, so that
low-level modules can take DraftTree without loading the cost machinery.
"""
