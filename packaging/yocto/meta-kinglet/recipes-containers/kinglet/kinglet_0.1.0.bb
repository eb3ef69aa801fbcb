SUMMARY = "kinglet: a kubelet for small machines"
DESCRIPTION = "Joins a Kubernetes cluster as a node and runs the pods bound \
to it, in-process (youki's libcontainer, no container daemon) or through \
CRI; pods keep running and come back when the control plane is unreachable."
HOMEPAGE = "https://github.com/kinglet/kinglet"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

# The prebuilt static binary (cross/build.sh; packaging/yocto/prepare.sh
# copies it here as kinglet-<arch>): nothing to compile, no toolchain.
KINGLET_ARCH = "${@{'x86_64': 'x86_64', 'aarch64': 'aarch64', 'arm': 'armv7'}.get(d.getVar('TARGET_ARCH'), 'unsupported')}"
COMPATIBLE_HOST = "(x86_64|aarch64|arm).*-linux.*"

SRC_URI = "\
    file://kinglet-${KINGLET_ARCH} \
    file://kinglet.service \
    file://config.yaml \
    file://10-kinglet.conflist \
    file://kinglet.tmpfiles \
    file://kinglet.network \
"
S = "${UNPACKDIR}"

inherit systemd

SYSTEMD_SERVICE:${PN} = "kinglet.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    install -D -m 0755 ${S}/kinglet-${KINGLET_ARCH} ${D}${bindir}/kinglet
    install -D -m 0644 ${S}/kinglet.service ${D}${systemd_system_unitdir}/kinglet.service
    install -d -m 0700 ${D}${sysconfdir}/kinglet ${D}${sysconfdir}/kinglet/manifests
    install -m 0600 ${S}/config.yaml ${D}${sysconfdir}/kinglet/config.yaml
    install -D -m 0644 ${S}/10-kinglet.conflist ${D}${sysconfdir}/cni/net.d/10-kinglet.conflist
    install -D -m 0644 ${S}/kinglet.tmpfiles ${D}${nonarch_libdir}/tmpfiles.d/kinglet.conf
    install -D -m 0644 ${S}/kinglet.network ${D}${nonarch_libdir}/systemd/network/05-kinglet.network
}

FILES:${PN} += "${systemd_system_unitdir}/kinglet.service ${nonarch_libdir}/tmpfiles.d/kinglet.conf \
    ${nonarch_libdir}/systemd/network/05-kinglet.network"
CONFFILES:${PN} = "${sysconfdir}/kinglet/config.yaml ${sysconfdir}/cni/net.d/10-kinglet.conflist"

# What kinglet runs with on the target: the CNI plugins of its default
# network (meta-virtualization's cni), iptables for the bridge's masquerade
# rule, mount/umount for volumes; the kernel features are in
# recipes-kernel/linux/linux-yocto/kinglet.cfg.
RDEPENDS:${PN} = "cni iptables util-linux-mount util-linux-umount"
RRECOMMENDS:${PN} = "kernel-module-overlay kernel-module-veth kernel-module-bridge kernel-module-br-netfilter kernel-module-xt-masquerade"

# A static binary: no shared libraries to find, and
# already stripped.
INSANE_SKIP:${PN} = "already-stripped ldflags"
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
