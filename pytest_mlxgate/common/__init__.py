"""The bottom layer: standard-library helpers every other folder uses (atomic writes, commit ids,
formatting). Imports nothing else of the package but `errors` (pytest only), so anything may import
it, the controller too."""
