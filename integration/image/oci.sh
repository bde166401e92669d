# OCI image layouts written with tar, gzip and sha256sum only, byte for byte the
# same from the same inputs (sorted entries, owner 0, one mtime, gzip without a
# name or time). Sourced by integration/image/build.sh (qoslet's image) and
# integration/testbed/build-image.sh (the test images); the caller works in an
# empty directory of its own and sets OCI_EPOCH (seconds: every mtime and the
# images' "created").

# oci_layer ROOTFS: a gzipped layer of ROOTFS in oci/blobs; sets LAYER_DIGEST,
# LAYER_SIZE and LAYER_DIFFID (the uncompressed tar's digest)
oci_layer() {
  mkdir -p oci/blobs/sha256
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$OCI_EPOCH" -C "$1" -cf layer.tar .
  LAYER_DIFFID=$(sha256sum layer.tar | cut -d' ' -f1)
  gzip -n -9 layer.tar
  LAYER_DIGEST=$(sha256sum layer.tar.gz | cut -d' ' -f1); LAYER_SIZE=$(stat -c %s layer.tar.gz)
  mv layer.tar.gz "oci/blobs/sha256/$LAYER_DIGEST"
}

# oci_blob FILE: moves FILE into oci/blobs; prints "digest size"
oci_blob() {
  local d s; d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mv "$1" "oci/blobs/sha256/$d"; echo "$d $s"
}

# oci_created: OCI_EPOCH as the RFC 3339 time of an image's "created"
oci_created() { date -u -d "@$OCI_EPOCH" +%Y-%m-%dT%H:%M:%SZ; }

# oci_image NAME CONFIG_JSON [MANIFEST_ANNOTATIONS_JSON]: the image's config and
# manifest blobs (one layer: the last oci_layer's); prints its descriptor for
# index.json, named NAME (containerd's import takes io.containerd.image.name)
oci_image() {
  local name=$1 ann=${3:-} cdig csize mdig msize
  printf '%s' "$2" > config.json
  read -r cdig csize < <(oci_blob config.json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]%s}' \
    "$cdig" "$csize" "$LAYER_DIGEST" "$LAYER_SIZE" "${ann:+,\"annotations\":$ann}" > manifest.json
  read -r mdig msize < <(oci_blob manifest.json)
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
    "$mdig" "$msize" "$name" "${name##*:}"
}

# oci_archive OUT DESCRIPTOR...: the layout (oci-layout, index.json with those
# manifests, the blobs) as one tar at OUT
oci_archive() {
  local out=$1; shift
  local IFS=,
  echo '{"imageLayoutVersion":"1.0.0"}' > oci/oci-layout
  echo "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[$*]}" > oci/index.json
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$OCI_EPOCH" -C oci -cf "$out" .
}
