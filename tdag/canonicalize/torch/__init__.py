"""The torch front end: torch.export's ATen graph (from a module, an ExportedProgram or a .pt2)
walked into a Program."""
