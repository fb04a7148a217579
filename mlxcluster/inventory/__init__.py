"""Which hosts: the inventory file (``inventory``), where it is looked for
(``inventory_search``) and Macs found on the network (``discovery``)."""
