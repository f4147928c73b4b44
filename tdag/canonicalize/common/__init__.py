"""What the three front ends share: splitting a graph into segments at control flow, and the one
op-table Registry."""
