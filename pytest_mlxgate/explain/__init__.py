"""Where a lever's drift comes from: the lever applied one scope of layers at a time, the error each
layer's output carries with the lever everywhere, and (for KV plans) the cheapest plan that passes."""
