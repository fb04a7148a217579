"""What is known about a host, below both doctor and topology.

``probe_script`` runs on the host (standard library only), ``collect`` pipes
it over SSH and returns one ``HostCapture`` per host, ``capture`` saves and
replays them, ``parsers`` read the raw command outputs, ``facts`` turns a
capture into ``HostFacts``, and ``mpi`` finds Open MPI (mpirun, libmpi) on
this machine.
"""
