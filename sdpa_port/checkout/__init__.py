"""The Transformers checkout around a ported file: where things live, its pinned tools, its copy markers."""
