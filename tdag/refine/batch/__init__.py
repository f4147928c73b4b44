"""The batch dimension: strip_batch gives the per-sample Program, add_batch its inverse."""
