"""pressrun: peer-assisted and multicast content distribution for e-magazine issues."""

__version__ = "0.1.0"
