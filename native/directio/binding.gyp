{
  "targets": [
    {
      "target_name": "memsnap_directio",
      "sources": ["directio.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
