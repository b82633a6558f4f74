# Sourced by deploy/check-image and deploy/check-compose (root): podman set up for this kind of
# machine, and the base image debian:bookworm-slim made locally when no registry is reachable.
#
# The caller defines log, die and CACHE (podman's storage and the base image, kept between
# runs) and calls podman_setup [extra tools...], then ensure_base_image; podman_build_args WORK
# adds to the array build_args what a build needs behind an intercepting proxy.

BASE=debian:bookworm-slim

# The tools (installed with apt-get when missing) and podman's settings.
podman_setup() {
    missing=()
    for tool in podman runc debootstrap curl "$@"; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi

    # podman's settings for this machine: storage under CACHE, cgroupfs, file events, runc.
    mkdir -p "$CACHE"
    printf '[storage]\ndriver="overlay"\ngraphroot="%s/storage"\nrunroot="%s/run"\n' \
        "$CACHE" "$CACHE" >"$CACHE/storage.conf"
    nofile=$(ulimit -Hn)
    cat >"$CACHE/containers.conf" <<EOC
[containers]
default_ulimits=["nofile=${nofile}:${nofile}","nproc=32768:32768"]
[engine]
cgroup_manager="cgroupfs"
events_logger="file"
runtime="runc"
EOC
    export CONTAINERS_STORAGE_CONF=$CACHE/storage.conf CONTAINERS_CONF=$CACHE/containers.conf
}

# The Debian mirror apt uses here (deb822 .sources or one-line lists), for the release suite.
debian_mirror() {
    local uri
    uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
    if [ -z "$uri" ]; then
        uri=$(grep -hE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            2>/dev/null | awk '$3 == "bookworm" {print $2}' | head -n1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}
security_mirror() {
    local uri
    uri=$(grep -hE '^URIs:|^deb[[:space:]]' /etc/apt/sources.list.d/*.sources \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -oE 'https?://[^ ]*-security[^ ]*' | head -n1 || true)
    echo "${uri:-http://deb.debian.org/debian-security}"
}

ensure_base_image() {
    # Made as Debian's official slim image is made (debuerreotype --slimify): documentation,
    # manual pages and translations excluded by a dpkg rule that later installs follow too, and no
    # apt lists or caches. A base from an earlier version of this script (not slim) is replaced.
    BASE_LABEL=retrieval-host.check-base=slim-1
    if podman image exists "$BASE" && [ "$(podman image inspect --format \
        '{{index .Labels "retrieval-host.check-base"}}' "$BASE")" = "${BASE_LABEL#*=}" ]; then
        log "base image $BASE: present (cache $CACHE)"
    else
        mirror=$(debian_mirror)
        log "base image $BASE: debootstrap --variant=minbase bookworm from $mirror"
        rootfs=$CACHE/rootfs
        rm -rf "$rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
        # The sources the official image carries (release, updates, security), on this mirror.
        rm -f "$rootfs/etc/apt/sources.list"
        cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOS
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $(security_mirror)
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
        cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOS'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOS
        find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
        find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
        rm -rf "$rootfs"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
        rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
            "$rootfs"/var/log/apt/* "$rootfs"/var/cache/debconf/*-old
        podman rmi -f "$BASE" >/dev/null 2>&1 || true
        tar -C "$rootfs" -c . | podman import --quiet --change "LABEL $BASE_LABEL" - "$BASE" >/dev/null
        rm -rf "$rootfs"
    fi
}

podman_build_args() {
    local work=$1
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        # Build time only: pip trusts the host's bundle (an intercepting proxy's CA, if any).
        printf '[global]\ncert = /run/host-ca.crt\n' >"$work/pip.conf"
        build_args+=(-v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro
            -v "$work/pip.conf:/etc/pip.conf:ro")
    fi
}
