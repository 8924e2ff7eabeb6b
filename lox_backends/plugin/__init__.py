"""The plugin contract: what a backend implements (`hooks`), how config strings
name backends and their options (`config`), and how installed plugins are found
(`registry`)."""
