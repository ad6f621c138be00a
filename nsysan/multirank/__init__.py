"""Several profiles of one distributed job analyzed together (`analyze_job`)."""

from nsysan.multirank.job import JobParams, JobResult, analyze_job, job_files, write_job_outputs

__all__ = ["JobParams", "JobResult", "analyze_job", "job_files", "write_job_outputs"]
