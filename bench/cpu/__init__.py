"""This machine's CPU as a platform: the measuring loop, its cluster entries, the host allocator, Hugging Face
training steps."""
