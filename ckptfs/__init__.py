"""ckptfs: a crash-consistent FUSE filesystem for training checkpoints."""

__version__ = "0.1.0"
META_DIR = ".ckptfs"
