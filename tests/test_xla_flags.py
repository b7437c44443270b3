"""XLA_FLAGS edits: one setting per flag, the others kept in order."""
from hybrid_nope.xla_flags import HOST_DEVICE_COUNT, set_in_environ, with_flag


def test_with_flag_replaces_every_earlier_setting_and_keeps_the_rest():
  flags = f"--a=1 {HOST_DEVICE_COUNT}=2 --b {HOST_DEVICE_COUNT}=4"
  assert with_flag(flags, HOST_DEVICE_COUNT, 8) == f"--a=1 --b {HOST_DEVICE_COUNT}=8"
  assert with_flag(flags, HOST_DEVICE_COUNT) == "--a=1 --b"
  assert with_flag("", "--b", True) == "--b=True"
  # A flag whose name extends another's is a different flag.
  assert with_flag("--ab=1 --a=2", "--a", 3) == "--ab=1 --a=3"


def test_set_in_environ_edits_only_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--keep=1")
  set_in_environ(HOST_DEVICE_COUNT, 2)
  set_in_environ(HOST_DEVICE_COUNT, 3)
  import os
  assert os.environ["XLA_FLAGS"] == f"--keep=1 {HOST_DEVICE_COUNT}=3"
  monkeypatch.delenv("XLA_FLAGS")
  set_in_environ(HOST_DEVICE_COUNT)
  assert os.environ["XLA_FLAGS"] == ""
