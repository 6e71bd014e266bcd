{
  "targets": [
    {
      "target_name": "memsnap_aead",
      "sources": ["aead.c"],
      "cflags": ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
