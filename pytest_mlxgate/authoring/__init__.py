"""Writing gates: `new_gate` scaffolds a gate module (`mlxgate new-gate`); `calibrate` suggests its limits."""
