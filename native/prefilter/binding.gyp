{
  "targets": [
    {
      "target_name": "memsnap_prefilter",
      "sources": ["prefilter.c", "sqlite_walk.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
