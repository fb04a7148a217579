"""How hosts are cabled: ``topology`` builds the model (ports, links, ring,
mesh) from captures, ``topology_dot`` draws it (Graphviz)."""
