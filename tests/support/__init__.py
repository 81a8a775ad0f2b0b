"""What the tests share that is not a fixture: paths, waiting, fake agents and allocators, in-process services, trace files."""
