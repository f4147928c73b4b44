"""tdag.to_onnx: a Program as an onnx.ModelProto that passes the checker and runs on onnxruntime."""
