"""What users run besides their training code: the `lox` command (`cli`), its
plots (`plot`) and demo (`demo`), and the earlier lox's tracker names (`aliases`)."""
