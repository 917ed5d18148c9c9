"""The bottom layer: standard-library helpers every other folder uses (atomic writes, commit ids,
formatting). Imports nothing else of the package, so anything may import it, the controller too."""
