"""Frontend: torch.export, PT2E quantization (torchao) and import into the qlower IR."""
