"""Getting a model: name → verified snapshot (hub download, embedded GGUF build, or a local
directory), the loaded model, and the machine it runs on."""
