# The kernel features kinglet needs (kinglet.cfg), for linux-yocto kernels.
FILESEXTRAPATHS:prepend := "${THISDIR}/linux-yocto:"
SRC_URI += "file://kinglet.cfg"
