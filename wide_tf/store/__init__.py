"""The workdir on disk or GCS: its layout, atomic writes, result records and group claims.

Every layer above schema may read and write the workdir through this package; it imports only
schema.
"""
