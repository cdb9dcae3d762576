# Sourced by build-arm64.sh and build-deb.sh: Debian's multiarch Rust for aarch64
# (rustup cannot download targets here) and qemu-user with the multiarch libc.
# Needs root (or sudo) the first time.
if ! [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || ! command -v aarch64-linux-gnu-gcc >/dev/null \
  || ! command -v qemu-aarch64-static >/dev/null || ! [ -e /lib/ld-linux-aarch64.so.1 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y rustc-web libstd-rust-web-dev:arm64 \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross libc6:arm64 qemu-user-static
fi
