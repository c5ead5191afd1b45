"""kinterval.suite"""
