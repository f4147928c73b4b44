"""Reading .pt2 archives safely: tdag checks every member before torch's loader reads any of it."""
