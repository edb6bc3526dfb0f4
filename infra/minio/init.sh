#!/bin/sh
# One-shot MinIO set-up for the compose deployment: the bucket, and two users whose policies separate the
# zones (pipeline: sources read-only, pipeline zones read-write; delivery: writes into sources/ only).
# Every credential comes from the environment (infra/.env, never committed).
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${MEDRECO_BUCKET:?}" "${MEDRECO_PREFIX:?}"
: "${AWS_ACCESS_KEY_ID:?}" "${AWS_SECRET_ACCESS_KEY:?}" "${MEDRECO_DELIVERY_ACCESS_KEY:?}" "${MEDRECO_DELIVERY_SECRET_KEY:?}"
mc alias set medreco http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "medreco/$MEDRECO_BUCKET"
mc version enable "medreco/$MEDRECO_BUCKET"
for p in pipeline delivery; do
  sed -e "s|\${MEDRECO_BUCKET}|$MEDRECO_BUCKET|g" -e "s|\${MEDRECO_PREFIX}|$MEDRECO_PREFIX|g" \
    "/policies/$p-policy.json" > "/tmp/$p.json"
  mc admin policy create medreco "medreco-$p" "/tmp/$p.json"
done
mc admin user add medreco "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
mc admin policy attach medreco medreco-pipeline --user "$AWS_ACCESS_KEY_ID" || true
mc admin user add medreco "$MEDRECO_DELIVERY_ACCESS_KEY" "$MEDRECO_DELIVERY_SECRET_KEY"
mc admin policy attach medreco medreco-delivery --user "$MEDRECO_DELIVERY_ACCESS_KEY" || true
