"""tdag.to_torch: a Program as a torch.nn.Module whose generated code calls torch's own kernels."""
