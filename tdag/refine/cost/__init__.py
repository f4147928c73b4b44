"""Cost analysis: the report (flops, bytes, per node, scope, TDAG and Program), its table, a fusion
model, a roofline and the causal share of attention."""
