{@insert} RETURNING {@columns}, TRUE AS inserted
