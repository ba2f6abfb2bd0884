"""Sets up an S3-compatible server (moto) for the agent's object-store tests: a user with a key
that may read and write S3, then, as that user, a bucket holding the given files. Prints the
user's key as JSON: {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ...}.

Run against `moto_server` started with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls
below are the only unauthenticated ones, and every request after them must be signed with a
key the server issued.

usage: s3_models.py ENDPOINT BUCKET KEY=FILE...
"""

import json
import sys

import boto3


def main() -> None:
    endpoint, bucket, *uploads = sys.argv[1:]
    anyone = dict(
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam = boto3.client("iam", **anyone)
    iam.create_user(UserName="models")
    key = iam.create_access_key(UserName="models")["AccessKey"]
    iam.put_user_policy(
        UserName="models",
        PolicyName="s3",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
            }
        ),
    )
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
    )
    s3.create_bucket(Bucket=bucket)
    for upload in uploads:
        name, path = upload.split("=", 1)
        with open(path, "rb") as f:
            s3.put_object(Bucket=bucket, Key=name, Body=f.read())
    print(
        json.dumps(
            {
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            }
        )
    )


if __name__ == "__main__":
    main()
