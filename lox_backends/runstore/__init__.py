"""Runs on disk or in a bucket: the format (`layout`), reading it back
(`reader`) and the filesystems it lives on (`filesystems`)."""
