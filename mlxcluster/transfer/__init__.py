"""Files to and from hosts, checked by sha256 at the other end: the one way
`train`'s data and model, `run`'s script, the code ranks import (launch/)
and doctor's wheels (doctor/fixes/) reach a host, and a rank's folder comes
back here.

    manifest.py  what is moved: files by name, size and sha256 (hashed here once)
    link.py      how a host is reached: OpenSSH (BatchMode, host keys checked) or bash
                 for this machine, or the doctor's open connections; every call bounded
    agent.py     what runs on the host (stdlib only, sent as ``python -S -c``): check,
                 receive, install, send, the shared-storage tokens
    send.py      check a host's copy, send what it lacks (rsync or a stream); ``Transferred``
    rsync.py     rsync over the link's own ssh, its progress read
    fetch.py     a host's folder brought here, verified by the agent's own receive
    view.py      a view here of a model only the hosts hold: its files but the weights,
                 of each weight file its safetensors header (the rest sparse); never sent
"""
