"""The ONNX front end: a model read safely, walked node by node into a Program; If, Loop, Scan and
the recurrent ops as controllers."""
