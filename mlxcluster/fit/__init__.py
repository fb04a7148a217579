"""Will this model fit these hosts, split this way: the model folder read
(its family, heads, tensors and bytes), each host's memory budget and wired
limit, the tensor or pipeline split judged, and train's stages placed by
memory. Read from facts; doctor, launch and serve import it, it imports none
of them."""
