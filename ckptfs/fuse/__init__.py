"""FUSE adapters over the facade (mfusepy today) and the kernel page-cache rule."""
