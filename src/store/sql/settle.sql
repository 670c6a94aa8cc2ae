UPDATE agent_operations SET {@settlement}, {@reported}
WHERE {@fence_report}
RETURNING {@columns}
