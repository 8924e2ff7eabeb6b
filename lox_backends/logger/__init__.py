"""The Logger: the public class (`logger`), the runs it opens (`runs`, `metadata`),
what it refuses at the call (`checks`), logs waiting for the next tick
(`pending`), one thread per backend (`worker`), multi-process jobs (`processes`)
and interpreter exit (`shutdown`)."""
